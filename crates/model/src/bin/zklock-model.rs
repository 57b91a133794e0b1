//! Walks the model: every scenario with every rule on (each property must hold), then each
//! rule switched off in the scenario that shows its hole (a counterexample must be found).
//!
//! `cargo run --release -p zklock-model -- [--deep] [--threads N]`; `--deep` allows one more of
//! every fault (a crash, a term, a late write, a cut, a deletion) in every scenario.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use zklock_model::{check, shown_by, Rule, Rules, Scenario, ZklockModel, HELD_HOLDS};

fn main() -> ExitCode {
    let mut deep = false;
    let mut threads = 2;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--deep" => deep = true,
            "--threads" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) => threads = n,
                None => return usage("--threads takes a number of threads"),
            },
            other => return usage(&format!("unknown argument {other:?}")),
        }
    }
    let mut failed = false;
    println!("every rule on{}:", if deep { " (deep)" } else { "" });
    for scenario in Scenario::ALL {
        let report = check(ZklockModel::new(scenario, Rules::all(), deep), threads, None);
        println!(
            "  {:?}: {} states ({} unique), depth {}, {:.1} s",
            scenario,
            report.states,
            report.unique_states,
            report.max_depth,
            report.elapsed.as_secs_f64()
        );
        for property in report.violated() {
            failed = true;
            println!("    VIOLATED {property}: {}", report.trace(property).unwrap_or_default());
        }
    }
    println!("each rule off, in the scenario that shows its hole:");
    for rule in Rule::ALL {
        let (scenario, property) = shown_by(rule);
        let report = check(ZklockModel::new(scenario, Rules::all().without(rule), deep), threads, Some(property));
        let found = report.trace(property);
        println!(
            "  {rule} off ({:?}, {} unique states, {:.1} s): {}",
            scenario,
            report.unique_states,
            report.elapsed.as_secs_f64(),
            if found.is_some() { "counterexample" } else { "NO COUNTEREXAMPLE" }
        );
        match found {
            Some(trace) => println!("    {property}:\n    {trace}"),
            None => failed = true,
        }
    }
    // Beyond the continuity rule's premise: a foreign client's first use of a lock path that no
    // zklock session watched leaves no trace a new term can read.
    let mut model = ZklockModel::new(Scenario::ForeignArrives, Rules::all(), deep);
    model.unwatched_foreign = true;
    let report = check(model, threads, Some(HELD_HOLDS));
    println!("beyond the premise (a foreign client first queues while no zklock session watches):");
    match report.trace(HELD_HOLDS) {
        Some(trace) => println!("  {HELD_HOLDS}:\n    {trace}"),
        None => {
            failed = true;
            println!("  no counterexample: the premise is no longer needed, say so in docs/design.md");
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!("zklock-model: {why}\nusage: zklock-model [--deep] [--threads N]");
    ExitCode::from(2)
}
