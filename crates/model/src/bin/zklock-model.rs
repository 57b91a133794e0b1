//! Walks the model: every scenario with every rule on (each property must hold), then each
//! rule switched off in the scenario that shows its hole (a counterexample must be found).
//!
//! `cargo run --release -p zklock-model -- [--more N] [--threads N] [--scenario NAME]…`; `--more N`
//! allows N more of every fault (a crash, a term, a late write, a cut, a deletion) in every
//! scenario (the test command walks 0 and 1); `--scenario` walks only those named (as printed).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use zklock_model::{check, shown_by, Rule, Rules, Scenario, ZklockModel, HELD_HOLDS};

fn main() -> ExitCode {
    let mut more = 0;
    let mut threads = 2;
    let mut only: Vec<String> = vec![];
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--more" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) => more = n,
                None => return usage("--more takes a number of faults"),
            },
            "--threads" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) => threads = n,
                None => return usage("--threads takes a number of threads"),
            },
            "--scenario" => match args.next() {
                Some(name) => only.push(name.to_lowercase()),
                None => return usage("--scenario takes a scenario's name"),
            },
            other => return usage(&format!("unknown argument {other:?}")),
        }
    }
    let mut failed = false;
    println!("every rule on, {more} more of every fault:");
    let chosen = |scenario: Scenario| only.is_empty() || only.contains(&format!("{scenario:?}").to_lowercase());
    if let Some(unknown) = only.iter().find(|n| !Scenario::ALL.iter().any(|s| format!("{s:?}").to_lowercase() == **n)) {
        return usage(&format!("no scenario {unknown:?}; there are {:?}", Scenario::ALL));
    }
    for scenario in Scenario::ALL.into_iter().filter(|s| chosen(*s)) {
        let report = check(ZklockModel::new(scenario, Rules::all(), more), threads, None);
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
        if !chosen(scenario) {
            continue;
        }
        let report = check(ZklockModel::new(scenario, Rules::all().without(rule), more), threads, Some(property));
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
    if !chosen(Scenario::ForeignArrives) {
        return if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS };
    }
    let mut model = ZklockModel::new(Scenario::ForeignArrives, Rules::all(), more);
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
    eprintln!("zklock-model: {why}\nusage: zklock-model [--more N] [--threads N] [--scenario NAME]...");
    ExitCode::from(2)
}
