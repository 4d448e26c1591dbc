//! Gangs in standalone mode: pods labelled `scheduling.x-k8s.io/pod-group` are
//! placed all or nothing (at least the PodGroup's `minMember`), against
//! kube-rs's mock API. A waiting gang holds nothing, so no gang is ever partly
//! bound and two gangs never deadlock.

mod common;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ObjectMeta;
use rand::{Rng, SeedableRng};
use tessera_api::{PodGroup, PodGroupSpec};
use tessera_k8s::mirror::{Mirror, SharedMirror, gang_of};
use tessera_k8s::standalone::Standalone;

fn group(name: &str, min: i32) -> PodGroup {
    PodGroup {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ml".into()),
            ..Default::default()
        },
        spec: PodGroupSpec {
            min_member: Some(min),
            schedule_timeout_seconds: None,
        },
    }
}

fn member(gang: &str, i: usize, gpus: u32) -> Pod {
    let name = format!("{gang}-{i}");
    let mut p = pod(
        "ml",
        &name,
        &format!("uid-{name}"),
        &[("tessera.io/gpu", &gpus.to_string())],
    );
    p.spec.as_mut().unwrap().scheduler_name = Some("tessera".into());
    p.metadata.labels = Some(
        [(
            "scheduling.x-k8s.io/pod-group".to_string(),
            gang.to_string(),
        )]
        .into(),
    );
    p
}

type Api = tokio::task::JoinHandle<Vec<Seen>>;

fn scheduler(
    gpus_per_node: &[u32],
    pods: Vec<Pod>,
    groups: Vec<PodGroup>,
    events: bool,
) -> (Standalone, SharedMirror, Api) {
    let nodes = (0..gpus_per_node.len())
        .map(|i| kube_node(&format!("n{i}"), "64", "256Gi"))
        .collect();
    let inv = gpus_per_node
        .iter()
        .enumerate()
        .map(|(i, &g)| gpu_node(&format!("n{i}"), "A100-80GB", 81_920, g))
        .collect();
    let m = mirror("tessera", nodes, inv, pods);
    m.lock().replace_pod_groups(groups);
    let (client, api) = mock_api(accept_writes);
    let s = standalone(&m, client, events);
    (s, m, api)
}

fn held_of(m: &Mirror, gang: &str, n: usize) -> usize {
    (0..n)
        .filter(|i| m.held(&format!("uid-{gang}-{i}")).is_some())
        .count()
}

fn notes(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .filter(|s| s.path.contains("/events"))
        .map(|s| s.body["note"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test]
async fn a_gang_is_bound_whole_or_not_at_all() {
    // Three members of 2 GPUs on one 4-GPU node: two would fit, the gang does not.
    let pods: Vec<Pod> = (0..3).map(|i| member("train", i, 2)).collect();
    let (mut s, m, api) = scheduler(&[4], pods, vec![group("train", 3)], true);
    s.pass().await;
    s.flush().await;
    assert_eq!(
        held_of(&m.lock(), "train", 3),
        0,
        "nothing held for a gang that does not fit"
    );
    // A second node arrives: the whole gang goes.
    {
        let mut g = m.lock();
        g.upsert_node(kube_node("n1", "64", "256Gi"));
        g.upsert_inventory(gpu_node("n1", "A100-80GB", 81_920, 4));
    }
    // Past the members' first backoff (1 s).
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    s.pass().await;
    s.flush().await;
    drop(s);
    assert_eq!(held_of(&m.lock(), "train", 3), 3);
    drop(m);
    let seen = api.await.unwrap();
    assert_eq!(
        seen.iter().filter(|s| s.path.ends_with("/binding")).count(),
        3
    );
    let notes = notes(&seen);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("gang ml/train does not fit")),
        "{notes:?}"
    );
}

#[tokio::test]
async fn a_gang_waits_for_its_members_and_its_podgroup() {
    // minMember 3, two members exist.
    let pods: Vec<Pod> = (0..2).map(|i| member("train", i, 1)).collect();
    let mut lone = member("orphan", 0, 1);
    lone.metadata.labels = Some(
        [(
            "scheduling.x-k8s.io/pod-group".to_string(),
            "nogroup".to_string(),
        )]
        .into(),
    );
    let mut all = pods;
    all.push(lone);
    let (mut s, m, api) = scheduler(&[8], all, vec![group("train", 3)], true);
    s.pass().await;
    s.flush().await;
    drop(s);
    assert_eq!(held_of(&m.lock(), "train", 2), 0);
    // Explain says the pod waits for its gang, and how far the gang is.
    let p = m.lock().pod("uid-train-0").unwrap().clone();
    let r = tessera_k8s::explain::report(&mut m.lock(), &p);
    assert!(
        r.to_string()
            .contains("placed only with its gang ml/train: minMember 3: 0 placed, 2 waiting"),
        "{r}"
    );
    assert!(m.lock().held("uid-orphan-0").is_none());
    drop(m);
    let notes = notes(&api.await.unwrap());
    assert!(
        notes.iter().any(|n| n.contains("2 of its 3 members exist")),
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.contains("PodGroup ml/nogroup, which does not exist")),
        "{notes:?}"
    );
}

#[tokio::test]
async fn beyond_min_member_the_rest_follow_one_by_one() {
    // minMember 2 of 3 members of 3 GPUs on two 4-GPU nodes: two go now, the third waits.
    let pods: Vec<Pod> = (0..3).map(|i| member("train", i, 3)).collect();
    let (mut s, m, api) = scheduler(&[4, 4], pods, vec![group("train", 2)], false);
    s.pass().await;
    s.flush().await;
    drop(s);
    assert_eq!(held_of(&m.lock(), "train", 3), 2);
    drop(m);
    drop(api);
}

/// Random gangs and single pods over random clusters: after a pass, each gang
/// holds none of its members or at least its minMember — never part.
#[tokio::test]
async fn no_gang_is_ever_partly_placed() {
    let (mut partial_possible, mut placed_gangs, mut refused_gangs) = (0, 0, 0);
    for seed in 0..150u64 {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let nodes: Vec<u32> = (0..rng.random_range(1..4))
            .map(|_| rng.random_range(1..=8))
            .collect();
        let mut pods = Vec::new();
        let mut groups = Vec::new();
        let mut sizes = Vec::new();
        for g in 0..rng.random_range(1..5) {
            let name = format!("g{g}");
            let n = rng.random_range(1..6usize);
            let min = rng.random_range(1..=n) as i32;
            groups.push(group(&name, min));
            for i in 0..n {
                pods.push(member(&name, i, rng.random_range(1..=4)));
            }
            sizes.push((name, n, min as usize));
        }
        for i in 0..rng.random_range(0..4) {
            let mut p = pod(
                "ml",
                &format!("single-{i}"),
                &format!("uid-single-{i}"),
                &[("tessera.io/gpu", "1")],
            );
            p.spec.as_mut().unwrap().scheduler_name = Some("tessera".into());
            pods.push(p);
        }
        let (mut s, m, api) = scheduler(&nodes, pods, groups, false);
        s.pass().await;
        s.flush().await;
        let g = m.lock();
        for (name, n, min) in &sizes {
            let held = held_of(&g, name, *n);
            assert!(
                held == 0 || held >= *min,
                "seed {seed}: gang {name} holds {held} of {n} (min {min}) on nodes {nodes:?}"
            );
            if held == 0 {
                refused_gangs += 1;
            } else {
                placed_gangs += 1;
            }
            if *min > 1 {
                partial_possible += 1;
            }
        }
        // Holds of gang members name their gang.
        for (uid, _) in g.holds() {
            let p = g.pod(uid).unwrap();
            assert_eq!(gang_of(p).is_some(), !uid.starts_with("uid-single"));
        }
        drop(g);
        drop(s);
        drop(m);
        drop(api);
    }
    // The random cases exercise both outcomes (so the assertion above is tested).
    assert!(
        placed_gangs > 20 && refused_gangs > 20 && partial_possible > 20,
        "{placed_gangs} placed, {refused_gangs} refused, {partial_possible} with minMember > 1"
    );
}
