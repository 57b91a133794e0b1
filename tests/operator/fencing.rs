//! Fencing enforced where the work lands (docs/design.md, "Beyond the lock", 1): objects
//! labelled as guarded by a lock whose fencing is `Enforced` accept a write only with the token
//! of a hold in force, never lower than the last they accepted — judged by the API server itself
//! (the chart's fencing policies), whatever client writes.

use crate::e2e_support;

use e2e_support::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;
use zklock::api::fencing_policy::{FENCED_BY, FENCED_BY_CLUSTER_LOCK, FENCING_REFUSAL, FENCING_TOKEN};
use zklock::api::{LockClaim, Phase};

fn token(claim: &LockClaim) -> String {
    let token = claim.status.as_ref().and_then(|s| s.fencing_token.clone());
    token.unwrap_or_else(|| panic!("a Held claim without a fencing token: {claim:?}"))
}

/// A holder's write of guarded ConfigMap `name`: its data and its token, in one request (a
/// merge patch, as a script's `kubectl patch` sends it). `Ok`, or the API server's refusal.
async fn write(api: &Api<ConfigMap>, name: &str, token: Option<&str>, value: &str) -> Result<(), String> {
    let mut patch = json!({ "data": { "written-by": value } });
    if let Some(token) = token {
        patch["metadata"] = json!({ "annotations": { FENCING_TOKEN: token } });
    }
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(format!("{} {}", status.code, status.message)),
        Err(e) => panic!("writing {name}: {e}"),
    }
}

fn refused(answer: Result<(), String>, what: &str) -> String {
    let message = answer.expect_err(what);
    assert!(
        message.starts_with("403") && message.contains(FENCING_REFUSAL),
        "{what}: refused by the policy, not {message}"
    );
    message
}

/// `Lock` `name` with its fencing enforced, seen by the operator: it grants fenced only once its
/// watch has the Lock (a grant before would not be), and the Lock's status says it was seen.
async fn fenced_lock(env: &Env, name: &str) -> Api<zklock::api::Lock> {
    let locks: Api<zklock::api::Lock> = Api::namespaced(env.client.clone(), &env.ns);
    let lock: zklock::api::Lock = serde_json::from_value(json!({
        "apiVersion": "zklock.io/v1alpha1", "kind": "Lock",
        "metadata": { "name": name }, "spec": { "fencing": "Enforced" },
    }))
    .expect("Lock json");
    locks.create(&PostParams::default(), &lock).await.unwrap_or_else(|e| panic!("create Lock {name}: {e}"));
    wait_lock(&locks, name, "its status written", |l| l.status.is_some()).await;
    locks
}

async fn guarded(api: &Api<ConfigMap>, name: &str, label: (&str, &str), token: &str) -> Result<(), String> {
    let object: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { label.0: label.1 }, "annotations": { FENCING_TOKEN: token } },
        "data": { "written-by": "nobody yet" },
    }))
    .expect("ConfigMap json");
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(format!("{} {}", status.code, status.message)),
        Err(e) => panic!("creating {name}: {e}"),
    }
}

/// Kleppmann's scenario, and the case his rule leaves open: holder A's hold ends (its claim
/// deleted, as a paused client's lease would run out) and B is granted. A's late write is
/// refused from B's grant on — before B wrote anything, and after — while B's writes land; a
/// write that carries no token, a token below the one the object last accepted, or a token of
/// no hold is refused; an object guarded by a lock whose fencing is not enforced accepts
/// nothing (no hold of it is in force).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holders_write_is_refused_by_the_api_server_from_the_next_grant_on() {
    let env = Env::new().await;
    let _policies = install_fencing_policy(&env).await;
    let _op = env.operator();
    fenced_lock(&env, "db").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);

    env.claim("a", "db", json!({})).await;
    let a = token(&env.wait_phase("a", Phase::Held).await);
    guarded(&configmaps, "work", (FENCED_BY, "db"), &a).await.expect("A creates the object it guards");
    write(&configmaps, "work", Some(&a), "a").await.expect("A writes with its token");
    refused(write(&configmaps, "work", Some("1"), "forged").await, "a token of no hold");

    env.claim("b", "db", json!({})).await;
    env.wait_phase("b", Phase::Waiting).await;
    env.delete_claim("a").await;
    let b = token(&env.wait_phase("b", Phase::Held).await);
    assert!(b.parse::<i64>().unwrap() > a.parse::<i64>().unwrap(), "tokens grow: {a} then {b}");
    // B has not written yet: "no lower than the last accepted" would let A's write through here.
    let message = refused(write(&configmaps, "work", Some(&a), "a, late").await, "A's write after B's grant");
    assert!(message.contains(&format!("holds in force: ,{b},")), "the refusal names the holds in force: {message}");
    write(&configmaps, "work", Some(&b), "b").await.expect("B writes with its token");
    refused(write(&configmaps, "work", Some(&a), "a, later").await, "A's write after B's");
    refused(guarded(&configmaps, "work-2", (FENCED_BY, "db"), &a).await, "A creating another guarded object");
    guarded(&configmaps, "work-2", (FENCED_BY, "db"), &b).await.expect("B creates one");
    // A write that leaves the annotation alone is judged by the token it keeps (B's): the
    // object's current holder's. One that removes it carries none.
    let bare = json!({ "metadata": { "annotations": { FENCING_TOKEN: null } } });
    let answer = configmaps.patch("work", &PatchParams::default(), &Patch::Merge(&bare)).await;
    assert!(
        matches!(&answer, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(FENCING_REFUSAL)),
        "a write without a token: {answer:?}"
    );
    let kept = configmaps.get("work").await.expect("read work");
    assert_eq!(kept.data.and_then(|d| d.get("written-by").cloned()).as_deref(), Some("b"), "B's write stands");

    // A lock whose fencing is not enforced guards nothing: no hold of it is ever in force.
    env.claim("c", "plain", json!({})).await;
    let c = token(&env.wait_phase("c", Phase::Held).await);
    refused(guarded(&configmaps, "work-3", (FENCED_BY, "plain"), &c).await, "a lock that is not fenced");
    env.delete_claim("b").await;
    env.delete_claim("c").await;
    env.wait_gone("b").await;
    env.wait_gone("c").await;
}

/// The same for a `ClusterLock`: its parameter lives in the operator's namespace, and an object
/// of any served namespace labelled with it is judged by the holds this cluster granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_locks_guarded_objects_accept_its_holder_and_refuse_the_one_before() {
    let env = Env::new().await;
    let _policies = install_fencing_policy(&env).await;
    let _op = env.operator();
    let mut spec = TestClusterLock::admitting(&env.ns);
    spec["fencing"] = json!("Enforced");
    let cluster_lock = TestClusterLock::make(&env, &format!("fenced-{}", env.ns), spec).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let clusters: Api<zklock::api::ClusterLock> = Api::all(env.client.clone());
    until("the ClusterLock's status written (the operator has seen it)", || async {
        clusters.get(&cluster_lock.name).await.is_ok_and(|l| l.status.is_some())
    })
    .await;

    env.claim_spec("a", json!({ "clusterLockName": cluster_lock.name })).await;
    let a = token(&env.wait_phase("a", Phase::Held).await);
    let label = (FENCED_BY_CLUSTER_LOCK, cluster_lock.name.as_str());
    guarded(&configmaps, "shared", label, &a).await.expect("A creates the object it guards");
    env.claim_spec("b", json!({ "clusterLockName": cluster_lock.name })).await;
    env.wait_phase("b", Phase::Waiting).await;
    env.delete_claim("a").await;
    let b = token(&env.wait_phase("b", Phase::Held).await);
    refused(write(&configmaps, "shared", Some(&a), "a, late").await, "A's write after B's grant");
    write(&configmaps, "shared", Some(&b), "b").await.expect("B writes with its token");
    env.delete_claim("b").await;
    env.wait_gone("b").await;
}

/// The PostgreSQL recipe (`examples/recipes/postgres-fence.sql`, as docs/user-guide.md shows it)
/// against a real PostgreSQL, with two holders' tokens in turn: each unit of work checks its
/// token in its own transaction. The earlier holder's late transaction is rolled back, work and
/// all, once the later holder committed one; before that it commits — Kleppmann's rule ("no lower
/// than the highest seen") cannot tell, which is what the API server's fencing adds for objects
/// in Kubernetes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgresql_recipe_rolls_back_a_stale_holders_transaction() {
    let env = Env::new().await;
    let _op = env.operator();
    let pg = tokio::task::spawn_blocking(zklock_testkit::postgres::PgServer::start).await.expect("start PostgreSQL");
    let recipe = format!("{}/examples/recipes/postgres-fence.sql", env!("CARGO_MANIFEST_DIR"));
    let made = pg.psql(&["-f", &recipe]);
    assert!(made.status.success(), "the recipe: {}", String::from_utf8_lossy(&made.stderr));
    let table = pg.psql(&["-c", "CREATE TABLE orders (id int PRIMARY KEY, written_by text NOT NULL)"]);
    assert!(table.status.success(), "{}", String::from_utf8_lossy(&table.stderr));
    // One unit of work: the check and the work in one transaction, as the guide shows it.
    let work = |token: &str, id: u32, who: &str| {
        let sql = format!(
            "BEGIN; SELECT zklock_fence('orders', {token}); INSERT INTO orders VALUES ({id}, '{who}'); COMMIT;"
        );
        let out = pg.psql(&["-c", &sql]);
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    };

    env.claim("a", "orders", json!({})).await;
    let a = token(&env.wait_phase("a", Phase::Held).await);
    work(&a, 1, "a").expect("A's work with its token");
    env.claim("b", "orders", json!({})).await;
    env.wait_phase("b", Phase::Waiting).await;
    env.delete_claim("a").await;
    let b = token(&env.wait_phase("b", Phase::Held).await);
    // The limit of any store that only compares tokens: B has written nothing here yet.
    work(&a, 2, "a, late").expect("before B's first transaction, A's token is still the highest seen");
    work(&b, 3, "b").expect("B's work with its token");
    let refused = work(&a, 4, "a, later").expect_err("A's transaction after B's");
    assert!(
        refused.contains("zklock fencing") && refused.contains(&b),
        "refused by the check, naming B's token: {refused}"
    );
    work(&b, 5, "b, again").expect("B's second transaction with its token");
    let rows = pg.psql(&["-c", "SELECT string_agg(id || '=' || written_by, ' ' ORDER BY id) FROM orders"]);
    assert_eq!(
        String::from_utf8_lossy(&rows.stdout).trim(),
        "1=a 2=a, late 3=b 5=b, again",
        "A's refused transaction left nothing behind"
    );
    env.delete_claim("b").await;
    env.wait_gone("b").await;
}

/// A `Lock` turned `Off` (or deleted) while it guards objects fails closed: its holds are taken
/// out of the parameter, so the objects still labelled with it accept nobody — not its last
/// holders for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_fencing_is_turned_off_leaves_its_objects_accepting_nobody() {
    let env = Env::new().await;
    let _policies = install_fencing_policy(&env).await;
    let _op = env.operator();
    let locks = fenced_lock(&env, "db").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    env.claim("a", "db", json!({})).await;
    let a = token(&env.wait_phase("a", Phase::Held).await);
    guarded(&configmaps, "work", (FENCED_BY, "db"), &a).await.expect("A creates the object it guards");

    let off = json!({ "spec": { "fencing": "Off" } });
    locks.patch("db", &PatchParams::default(), &Patch::Merge(&off)).await.expect("turn fencing off");
    let refusal = std::sync::Mutex::new(String::new());
    until("the holder's write refused once its Lock's fencing is off", || async {
        match write(&configmaps, "work", Some(&a), "a").await {
            Ok(()) => false,
            Err(message) => {
                *refusal.lock().unwrap() = message;
                true
            }
        }
    })
    .await;
    let message = refusal.into_inner().unwrap();
    assert!(message.contains("holds in force: none"), "refused for want of any hold: {message}");
    env.delete_claim("a").await;
    env.wait_gone("a").await;
}
