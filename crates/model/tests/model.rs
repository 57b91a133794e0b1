//! The model in the test command: with every rule on every property holds in every scenario;
//! with each rule off the checker finds the hole the rule closed; and every rule names code
//! that exists.

use std::path::Path;

use zklock_model::{check, shown_by, Report, Rule, Rules, Scenario, ZklockModel, HELD_HOLDS};

/// The test command's machines have two cores.
const THREADS: usize = 2;

fn print(report: &Report) {
    println!(
        "{:?} with {:?} off: {} states ({} unique), depth {}, {:.2} s",
        report.scenario,
        report.off,
        report.states,
        report.unique_states,
        report.max_depth,
        report.elapsed.as_secs_f64()
    );
}

/// Each property that failed, with its counterexample.
fn violations(report: &Report) -> Vec<String> {
    report.violated().into_iter().map(|p| format!("{p}: {}", report.trace(p).unwrap_or_default())).collect()
}

#[test]
fn every_property_holds_in_every_scenario_with_every_rule_on() {
    for scenario in Scenario::ALL {
        let report = check(ZklockModel::new(scenario, Rules::all(), 0), THREADS, None);
        print(&report);
        let violated = violations(&report);
        assert!(violated.is_empty(), "{scenario:?}: {violated:#?}");
        // A model that never grants or never changes leaders would pass vacuously.
        assert!(report.trace("a claim is granted or kept").is_some(), "{scenario:?} never grants or keeps a claim");
        assert!(report.trace("a leader change completes").is_some(), "{scenario:?} never completes a leader change");
    }
}

/// Switches `rule` off in the scenario that shows its hole, and expects that hole's property
/// to fail (printing the shortest counterexample, as docs/design.md quotes it), at the
/// scenario's own bounds and with one more of every fault (more steps must not hide it).
fn hole_found(rule: Rule) -> String {
    let (scenario, property) = shown_by(rule);
    let mut first = None;
    for more in [0, 1] {
        let report = check(ZklockModel::new(scenario, Rules::all().without(rule), more), THREADS, Some(property));
        print(&report);
        let trace = report.trace(property).unwrap_or_else(|| {
            panic!(
                "{rule} off, {more} more: no counterexample to {property:?} in {scenario:?} (found: {:?})",
                report.violated()
            )
        });
        println!("{rule} off, {more} more, {property}:\n  {trace}");
        first.get_or_insert(trace);
    }
    first.unwrap_or_default()
}

#[test]
fn without_the_zookeeper_epoch_guard_a_deposed_terms_write_lands() {
    hole_found(Rule::ZkEpochGuard);
}

#[test]
fn without_the_epoch_policy_a_deposed_leaders_late_held_lands() {
    hole_found(Rule::EpochPolicy);
}

#[test]
fn with_the_replay_taken_before_the_fence_a_late_grant_escapes_judgement() {
    hole_found(Rule::ReplayAfterFence);
}

#[test]
fn without_the_continuity_rule_a_holder_is_kept_across_a_session_a_foreign_client_used() {
    hole_found(Rule::Continuity);
}

#[test]
fn without_the_recorded_place_a_displaced_cluster_lock_holder_is_kept() {
    hole_found(Rule::PlaceIsRecordedNode);
}

#[test]
fn without_the_serve_bound_a_cut_off_clusters_holder_stays_held_beside_the_next() {
    hole_found(Rule::ServeBound);
}

#[test]
fn without_the_judged_hold_a_pod_starts_under_a_hold_the_new_term_ends() {
    hole_found(Rule::JudgedHold);
}

#[test]
fn without_the_revocation_check_a_pod_starts_only_to_be_told_to_stop() {
    hole_found(Rule::NoGateWhileRevoked);
}

#[test]
fn without_fresh_tokens_permits_raised_in_two_clusters_grant_one_token_twice() {
    hole_found(Rule::FreshTokens);
}

#[test]
fn without_the_status_before_the_release_two_clusters_show_two_holders() {
    hole_found(Rule::StatusBeforeRelease);
}

#[test]
fn without_skipping_finished_claims_a_ghost_waiter_blocks_its_lock() {
    hole_found(Rule::SkipFinishedClaims);
}

#[test]
fn without_hearing_foreign_creates_a_cut_off_operator_keeps_a_holder_a_curator_client_then_gets() {
    hole_found(Rule::SeeForeignCreates);
}

/// The continuity rule's premise, shown: a foreign client that first queues and leaves while no
/// zklock session watches the directory leaves nothing a new term can read, and a holder kept
/// there may have been held by it in the gap. docs/design.md states the premise with this trace;
/// when it no longer holds, this fails and the premise can go.
#[test]
fn beyond_the_premise_a_foreign_client_nobody_watched_is_invisible_to_the_continuity_rule() {
    let mut model = ZklockModel::new(Scenario::ForeignArrives, Rules::all(), 0);
    model.unwatched_foreign = true;
    let report = check(model, THREADS, Some(HELD_HOLDS));
    print(&report);
    let trace = report.trace(HELD_HOLDS).expect("a counterexample beyond the premise");
    println!("beyond the premise:\n  {trace}");
}

/// The open question of the gated path: may the gate go on the answer of the claim's `Held`
/// write, instead of once that `Held` comes back on the watch? With the gate removed in the
/// grant's own step, every property still holds, in the deep walk too.
#[test]
fn ungating_on_the_grants_answer_keeps_every_property() {
    for more in [0, 1] {
        let mut model = ZklockModel::new(Scenario::Foreign, Rules::all(), more);
        model.ungate_on_answer = true;
        let report = check(model, THREADS, None);
        print(&report);
        assert!(report.violated().is_empty(), "{:?}", report.violated());
    }
}

/// Every rule names the functions that implement it: when one is renamed or goes, the model and
/// the code have drifted apart, and this fails until the rule names the code again.
#[test]
fn every_rule_names_functions_that_exist_in_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut missing = vec![];
    for rule in Rule::ALL {
        for (file, function) in rule.code() {
            let text = std::fs::read_to_string(root.join(file)).unwrap_or_default();
            let defined = text.lines().any(|line| {
                let line = line.trim_start();
                let line = line
                    .strip_prefix("pub ")
                    .or_else(|| line.strip_prefix("pub(crate) "))
                    .or_else(|| line.strip_prefix("pub(super) "))
                    .unwrap_or(line);
                let line = line.strip_prefix("async ").unwrap_or(line);
                line.starts_with(&format!("fn {function}(")) || line.starts_with(&format!("fn {function}<"))
            });
            if !defined {
                missing.push(format!("{rule}: {file} has no fn {function}"));
            }
        }
    }
    assert!(missing.is_empty(), "the model names code that is gone: {missing:#?}");
}

/// The deep walk (one more of every fault in every scenario) in the test command too: every
/// property holds there as well. Deeper: `cargo run --release -p zklock-model -- --more 2`.
#[test]
fn every_property_holds_in_the_deep_walk_with_every_rule_on() {
    for scenario in Scenario::ALL {
        let report = check(ZklockModel::new(scenario, Rules::all(), 1), THREADS, None);
        print(&report);
        let violated = violations(&report);
        assert!(violated.is_empty(), "{scenario:?} (deep): {violated:#?}");
    }
}

/// The command docs/development.md shows for deeper walks: it runs, walks what it is asked to,
/// prints each counterexample, and refuses a scenario it does not have.
#[test]
fn the_documented_model_command_walks_and_prints_its_counterexamples() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_zklock-model")).args(args).output().expect("run zklock-model")
    };
    let out = run(&["--more", "0", "--scenario", "permits", "--scenario", "ghost"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("Permits:") && text.contains("Ghost:") && !text.contains("Foreign:"), "{text}");
    assert!(text.contains("Raise → Grant(a0) → Grant(b0)"), "the FreshTokens counterexample: {text}");
    let out = run(&["--scenario", "nowhere"]);
    assert_eq!(out.status.code(), Some(2), "an unknown scenario is refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no scenario"), "and says so");
}
