//! The web view in a real browser: the scheduler's ops surface (`ops_router`)
//! served on a socket over a mirror of a mock cluster, loaded by headless
//! Chromium; assertions on the DOM. Also the UI's JSON routes without a browser.

mod browser;
mod common;

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use tessera_api::{GpuHealth, GpuNode};
use tessera_core::allocation::ANNOTATION;
use tessera_k8s::extender::ops_router;
use tessera_k8s::mirror::{Mirror, Reservation, SharedMirror};

use browser::Browser;
use common::{gpu_node, gpu_queue, kube_node, pod, queue_namespace};

/// `nodes` nodes: even ones 8 × A100-80GB, odd ones 4 × L4. GPU 1 of node 3 is unhealthy.
fn cluster(nodes: usize) -> (Vec<k8s_openapi::api::core::v1::Node>, Vec<GpuNode>) {
    let mut kn = Vec::new();
    let mut gn = Vec::new();
    for i in 0..nodes {
        let name = format!("node-{i:05}");
        kn.push(kube_node(&name, "64", "512Gi"));
        let mut g = if i % 2 == 0 {
            gpu_node(&name, "A100-80GB", 81_920, 8)
        } else {
            gpu_node(&name, "L4", 23_034, 4)
        };
        if i == 3 {
            g.spec.gpus[1].health = GpuHealth::Unhealthy;
        }
        gn.push(g);
    }
    (kn, gn)
}

/// Reserves `p` on `node` and shows it bound, as the watch would after the bind.
fn place(m: &mut Mirror, mut p: Pod, node: &str) -> bool {
    let Ok(Reservation::Write { annotation }) = m.reserve(&p, node) else {
        return false;
    };
    if let Some(a) = annotation {
        p.metadata.annotations = Some([(ANNOTATION.to_string(), a)].into());
    }
    p.spec.as_mut().expect("spec").node_name = Some(node.to_string());
    m.upsert_pod(p);
    true
}

/// Fills about `fill` of the GPUs with whole GPUs and halves, in three namespaces.
fn fill(m: &mut Mirror, nodes: usize, fill: f64) -> usize {
    let namespaces = ["ml-train", "cv-infer", "nlp"];
    let mut placed = 0;
    let target = (nodes as f64 * 6.0 * fill) as usize;
    let mut k = 0usize;
    while placed < target && k < target * 3 {
        let node = format!("node-{:05}", (k * 7) % nodes);
        let ns = namespaces[k % 3];
        let res: &[(&str, &str)] = if k % 3 == 1 {
            &[("tessera.io/gpu-milli", "500")]
        } else {
            &[("tessera.io/gpu", "1")]
        };
        let p = pod(ns, &format!("job-{k}"), &format!("uid-{k}"), res);
        if place(m, p, &node) {
            placed += 1;
        }
        k += 1;
    }
    placed
}

fn pending_with_condition(name: &str, message: &str) -> Pod {
    let mut p = pod(
        "ml-train",
        name,
        &format!("uid-{name}"),
        &[("tessera.io/gpu", "2")],
    );
    p.status = Some(PodStatus {
        phase: Some("Pending".into()),
        conditions: Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some(message.into()),
            ..Default::default()
        }]),
        ..Default::default()
    });
    p
}

struct Served {
    base: String,
    mirror: SharedMirror,
    server: tokio::task::JoinHandle<()>,
}

/// kube-scheduler's condition message for a pod no node has GPUs for.
fn insufficient(nodes: usize) -> String {
    format!("0/{nodes} nodes are available: {nodes} Insufficient tessera.io/gpu.")
}

async fn serve(nodes: usize, fill_ratio: f64) -> Served {
    let (kn, gn) = cluster(nodes);
    let mirror = common::mirror("tessera", kn, gn, vec![]);
    {
        let mut m = mirror.lock();
        // Two teams under one organisation; nlp and ml-train share the research queue.
        m.replace_queues(vec![
            gpu_queue("org", None, "600"),
            gpu_queue("research", Some("org"), "300"),
            gpu_queue("prod", Some("org"), "200"),
        ]);
        m.replace_namespaces(vec![
            queue_namespace("ml-train", "research"),
            queue_namespace("nlp", "research"),
            queue_namespace("cv-infer", "prod"),
        ]);
        let placed = fill(&mut m, nodes, fill_ratio);
        assert!(placed > nodes, "the fill placed only {placed} pods");
        // Never fits: no node has 16 GPUs; its reason is Tessera's explanation.
        m.upsert_pod(pod("nlp", "huge", "uid-huge", &[("tessera.io/gpu", "16")]));
        // kube-scheduler's own word wins where it wrote one.
        m.upsert_pod(pending_with_condition("waiting", &insufficient(nodes)));
    }
    let app = ops_router(common::state(mirror.clone(), None));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Served {
        base: format!("http://{addr}"),
        mirror,
        server,
    }
}

/// Size of the body at `url` (plain HTTP/1.0 GET on a socket, as a browser would fetch it).
fn fetch(url: &str) -> Vec<u8> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("http URL");
    let (host, path) = rest.split_once('/').map_or((rest, "/"), |(h, p)| (h, p));
    let mut s = std::net::TcpStream::connect(host).expect("connect");
    s.write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let at = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("HTTP header end");
    all.split_off(at + 4)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mosaic_loads_in_chromium_shows_reasons_and_updates_live() {
    let Some(mut b) = Browser::launch() else {
        return;
    };
    let s = serve(200, 0.6).await;
    b.open(&format!("{}/ui", s.base), 1400, 1000);
    b.wait_for(
        "document.querySelectorAll('.tile').length === 200",
        "200 tiles",
    );
    // Node 3's GPU 1 is unhealthy; nobody else's is.
    assert_eq!(b.eval("document.querySelectorAll('.gpu.bad').length"), 1);
    assert_eq!(
        b.eval("document.querySelectorAll('.tile[data-node=\"node-00003\"] .gpu.bad').length"),
        1
    );
    // Tenants are drawn, coloured by namespace.
    let cv = b.eval("document.querySelectorAll('.gpu i[data-ns=\"cv-infer\"]').length");
    assert!(
        cv.as_u64().unwrap_or(0) > 0,
        "no cv-infer shares drawn: {cv}"
    );
    // Pending pods with their reasons: Tessera's explanation, and the scheduler's message.
    let huge = b.wait_for(
        "document.querySelector('#pending li[data-pod=\"nlp/huge\"] .reason')?.textContent",
        "the pending pod nlp/huge",
    );
    assert!(
        huge.as_str().unwrap().contains("fewer than 16 GPUs"),
        "reason: {huge}"
    );
    let waiting = b.eval(
        "document.querySelector('#pending li[data-pod=\"ml-train/waiting\"] .reason')?.textContent",
    );
    assert_eq!(waiting, insufficient(200).as_str());

    // The queue tree: the parent first, its children under it.
    let rows = b.wait_for(
        "[...document.querySelectorAll('#queues tr[data-queue]')].map(r => r.dataset.queue).join(',') || null",
        "the queue rows",
    );
    assert_eq!(rows, "org,prod,research");
    let held = |b: &mut Browser, q: &str| -> f64 {
        let v = b.eval(&format!(
            "document.querySelector('#queues tr[data-queue=\"{q}\"] .held').textContent"
        ));
        v.as_str().unwrap().parse().unwrap()
    };
    let (org, prod, research) = (
        held(&mut b, "org"),
        held(&mut b, "prod"),
        held(&mut b, "research"),
    );
    assert!(
        prod > 0.0 && research > 0.0,
        "prod {prod}, research {research}"
    );
    // A parent holds what its children hold (to the page's rounding).
    assert!(
        (org - prod - research).abs() < 0.2,
        "{org} vs {prod} + {research}"
    );
    // The page shows what the server computed.
    let snap: serde_json::Value =
        serde_json::from_slice(&fetch(&format!("{}/ui/snapshot", s.base))).unwrap();
    let served = snap["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["q"] == "prod")
        .unwrap()["h"]
        .as_f64()
        .unwrap();
    assert!((served / 1000.0 - prod).abs() <= 0.5, "{served} vs {prod}");

    // The workload the policy scores against: learned from the pods the mirror has
    // seen, its heaviest shapes as the server reports them.
    let head = b.wait_for(
        "document.querySelector('#workloadbox:not([hidden]) #wlhead')?.textContent || null",
        "the workload box",
    );
    let w = &snap["workload"];
    assert_eq!(
        head.as_str().unwrap(),
        format!(
            "learned from {} pods on a prior of {}; {} shapes, rebuilt {}×",
            w["podsLearned"],
            w["priorPods"].as_f64().unwrap(),
            w["shapes"],
            w["generation"]
        ),
        "{w}"
    );
    assert!(w["podsLearned"].as_u64().unwrap() > 200, "{w}");
    let shapes = b.eval("document.querySelectorAll('#shapes li').length");
    assert_eq!(
        shapes.as_u64(),
        Some(w["top"].as_array().unwrap().len() as u64)
    );
    let first = b.eval("document.querySelector('#shapes li').textContent");
    assert_eq!(
        first.as_str().unwrap(),
        format!(
            "{:.1}% {}",
            100.0 * w["top"][0]["weight"].as_f64().unwrap(),
            w["top"][0]["text"].as_str().unwrap()
        )
    );

    // A change in the cluster reaches the open page over server-sent events.
    let live = "document.querySelectorAll('.tile[data-node=\"node-00198\"] i[data-ns=\"live-team\"]').length";
    assert_eq!(b.eval(live), 0);
    {
        let mut m = s.mirror.lock();
        assert!(place(
            &mut m,
            pod(
                "live-team",
                "new",
                "uid-new",
                &[("tessera.io/gpu-milli", "250")]
            ),
            "node-00198"
        ));
        m.remove_pod("uid-huge");
    }
    b.wait_for(live, "the new live-team share on node-00198");
    {
        // Four more whole GPUs for prod: its row follows.
        let mut m = s.mirror.lock();
        assert!(place(
            &mut m,
            pod("cv-infer", "more", "uid-more", &[("tessera.io/gpu", "4")]),
            "node-00196"
        ));
    }
    b.wait_for(
        &format!(
            "Number(document.querySelector('#queues tr[data-queue=\"prod\"] .held').textContent) > {prod}"
        ),
        "prod's held GPU-equivalents to grow",
    );
    b.wait_for(
        "!document.querySelector('#pending li[data-pod=\"nlp/huge\"]')",
        "nlp/huge leaving the pending list",
    );
    // No problem so far, so no problems box; a pod bound to a node Tessera does
    // not know shows up in it live.
    assert_eq!(b.eval("document.getElementById('problembox').hidden"), true);
    {
        let mut ghost = pod("nlp", "lost", "uid-lost", &[("tessera.io/gpu", "1")]);
        ghost.spec.as_mut().unwrap().node_name = Some("node-gone".into());
        s.mirror.lock().upsert_pod(ghost);
    }
    let problem = b.wait_for(
        "document.querySelector('#problembox:not([hidden]) #problems li')?.textContent || null",
        "the problems box",
    );
    assert!(problem.as_str().unwrap().contains("nlp/lost"), "{problem}");
    assert_eq!(
        b.eval("document.getElementById('probcount').textContent"),
        "(1)"
    );
    assert!(
        b.eval("window.tessera.frames").as_u64().unwrap_or(0) >= 2,
        "the update came as a new frame"
    );

    // Search by GPU UUID highlights the node and the GPU.
    b.eval("(() => { const q = document.getElementById('q'); q.value = 'GPU-node-00042-5'; q.dispatchEvent(new Event('input')); })()");
    b.wait_for(
        "document.querySelector('.tile.hit')?.dataset.node",
        "a search hit",
    );
    assert_eq!(
        b.eval("[...document.querySelectorAll('.tile.hit')].map(t => t.dataset.node)"),
        serde_json::json!(["node-00042"])
    );
    assert_eq!(
        b.eval("document.querySelector('.tile.hit .gpu.hit')?.dataset.gpu"),
        "5"
    );
    s.server.abort();
}

/// The 1,000-node screenshot and the figures: page weight and time to first
/// paint. Run by hand: `cargo test -p tessera-k8s --test ui -- --ignored`
/// (`TESSERA_UI_SCREENSHOT` names the PNG; default: the temp directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes a screenshot; run by hand"]
async fn mosaic_at_1000_nodes_screenshot_and_figures() {
    let Some(mut b) = Browser::launch() else {
        return;
    };
    let s = serve(1000, 0.7).await;
    let mut weight = 0usize;
    for path in ["ui/", "ui/app.js", "ui/app.css", "ui/snapshot"] {
        let n = fetch(&format!("{}/{path}", s.base)).len();
        println!("page weight: /{path} {n} bytes");
        weight += n;
    }
    println!("page weight: total {weight} bytes (uncompressed)");
    let started = Instant::now();
    b.open(&format!("{}/ui/", s.base), 1600, 1200);
    b.wait_for(
        "document.querySelectorAll('.tile').length === 1000 && window.tessera.firstMosaicMs",
        "1000 tiles",
    );
    println!(
        "mosaic visible {} ms after navigation start (in-page), {:?} wall incl. browser start-up; paint entries: {}",
        b.eval("Math.round(window.tessera.firstMosaicMs)"),
        started.elapsed(),
        b.eval("JSON.stringify(performance.getEntriesByType('paint').map(e => [e.name, Math.round(e.startTime)]))")
    );
    // What one tick costs the scheduler (the mirror is locked meanwhile).
    let o = tessera_k8s::ui::Observer::new(
        s.mirror.clone(),
        Arc::new(tessera_k8s::metrics::Metrics::new()),
    );
    let tick = Instant::now();
    o.observe(1_700_000_000_000);
    println!("one observer tick at 1000 nodes: {:?}", tick.elapsed());
    let out = std::env::var_os("TESSERA_UI_SCREENSHOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("tessera-ui-1000.png"));
    b.screenshot(&out);
    println!("screenshot: {}", out.display());
    s.server.abort();
}

/// The JSON behind the page, without a browser: a full frame, search and chargeback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_find_and_chargeback_answer_json() {
    let s = serve(200, 0.3).await;
    let snap: serde_json::Value =
        serde_json::from_slice(&fetch(&format!("{}/ui/snapshot", s.base))).unwrap();
    assert_eq!(snap["nodes"].as_array().unwrap().len(), 200);
    assert_eq!(snap["sum"]["unhealthyGpus"], 1);
    // 100 nodes × 8 + 100 × 4 GPUs, one unhealthy.
    assert_eq!(snap["sum"]["gpus"], 1200);
    assert_eq!(snap["sum"]["capacityMilli"], 1199 * 1000);
    let found: serde_json::Value =
        serde_json::from_slice(&fetch(&format!("{}/ui/find?q=gpu-node-00007-2", s.base))).unwrap();
    assert_eq!(found[0]["node"], "node-00007");
    assert_eq!(found[0]["gpu"], 2);
    let usage: serde_json::Value =
        serde_json::from_slice(&fetch(&format!("{}/chargeback", s.base))).unwrap();
    assert_eq!(usage["bucketSeconds"], 300);
    let bad = fetch(&format!("{}/chargeback?from=yesterday", s.base));
    assert!(
        String::from_utf8_lossy(&bad).contains("unix seconds"),
        "{}",
        String::from_utf8_lossy(&bad)
    );
    s.server.abort();
}

/// The scheduler's accounting integrates what the mirror holds between ticks:
/// GPU-seconds per namespace (with its queue) and mode equal Σ grant × time held,
/// in the meter, on `/chargeback` and in the Prometheus counters alike.
#[test]
fn accounting_charges_each_grant_for_the_time_it_was_held() {
    use tessera_core::chargeback::{Account, Mode};
    let (kn, gn) = cluster(4);
    let mirror = common::mirror("tessera", kn, gn, vec![]);
    {
        // ml's pods count against the research queue; cv is in none.
        let mut m = mirror.lock();
        m.replace_queues(vec![gpu_queue("research", None, "8")]);
        m.replace_namespaces(vec![queue_namespace("ml", "research")]);
    }
    let metrics = Arc::new(tessera_k8s::metrics::Metrics::new());
    let o = tessera_k8s::ui::Observer::new(mirror.clone(), metrics.clone());
    let t0 = 1_700_000_000_000u64;
    o.observe(t0);
    {
        let mut m = mirror.lock();
        assert!(place(
            &mut m,
            pod("ml", "a", "uid-a", &[("tessera.io/gpu", "2")]),
            "node-00000"
        ));
        assert!(place(
            &mut m,
            pod("cv", "b", "uid-b", &[("tessera.io/gpu-milli", "300")]),
            "node-00001"
        ));
    }
    o.observe(t0 + 10_000);
    mirror.lock().remove_pod("uid-a");
    o.observe(t0 + 25_000);
    o.observe(t0 + 40_000);
    // ml: 2 GPUs × 15 s = 30 GPU-s; cv: 0.3 GPU × 30 s = 9 GPU-s (in milli × ms: × 10⁶).
    let totals = o.with_meter(|m| m.totals().clone());
    let acct = |ns: &str, queue: &str, model: &str, mode| Account {
        namespace: ns.into(),
        model: model.into(),
        mode,
        queue: queue.into(),
    };
    assert_eq!(
        totals[&acct("ml", "research", "A100-80GB", Mode::Whole)],
        2000 * 15_000
    );
    assert_eq!(totals[&acct("cv", "", "L4", Mode::Share)], 300 * 30_000);
    assert_eq!(totals.len(), 2);
    let text = metrics.encode().unwrap();
    assert!(
        text.contains(
            r#"tessera_gpu_seconds_total{namespace="ml",queue="research",model="A100-80GB",mode="whole"} 30.0"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"tessera_gpu_seconds_total{namespace="cv",queue="",model="L4",mode="share"} 9.0"#
        ),
        "{text}"
    );
    // A bill by queue: research's 30 GPU-seconds, and cv's 9 under no queue.
    let usage = o.with_meter(|m| tessera_k8s::accounting::Usage::from_meter(m, 0, u64::MAX / 1000));
    let lines = tessera_core::chargeback::by_queue(tessera_core::chargeback::bill(
        &usage.to_buckets(),
        &Default::default(),
    ));
    let by: Vec<(&str, f64)> = lines
        .iter()
        .map(|l| (l.queue.as_str(), l.gpu_seconds))
        .collect();
    assert_eq!(by, [("", 9.0), ("research", 30.0)]);
}

/// The offline page (the simulator's fill snapshot) renders from the frame
/// embedded in it, with no server: opened from a file.
#[test]
fn the_offline_snapshot_renders_from_a_file() {
    let Some(mut b) = Browser::launch() else {
        return;
    };
    let (kn, gn) = cluster(30);
    let mirror = common::mirror("tessera", kn, gn, vec![]);
    let mut m = mirror.lock();
    fill(&mut m, 30, 0.5);
    let names: std::collections::HashMap<tessera_core::AllocId, (String, String)> = m
        .holds()
        .filter_map(|(_, h)| {
            let id = h.id?;
            let (ns, pod) = h.pod.split_once('/')?;
            Some((id, (ns.to_string(), pod.to_string())))
        })
        .collect();
    let page = tessera_k8s::ui::ledger_page(
        &m.cluster().clone(),
        &m.ledger().clone(),
        |id| names.get(&id).cloned().unwrap_or_default(),
        &m.target_workload(),
        "fill </script> at 100 %",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mosaic.html");
    std::fs::write(&path, page).unwrap();
    b.open(&format!("file://{}", path.display()), 1200, 800);
    b.wait_for(
        "document.querySelectorAll('.tile').length === 30",
        "30 tiles",
    );
    assert!(
        b.eval("document.querySelectorAll('.gpu i[data-ns=\"nlp\"]').length")
            .as_u64()
            .unwrap_or(0)
            > 0
    );
    // Escaped in the HTML, so the title is the text itself and the page intact.
    assert_eq!(b.eval("document.title"), "fill </script> at 100 %");
}

/// A tick's delta carries only the tiles that changed (and the pending list
/// and summary), so a 1,000-node page is not resent on every change.
#[test]
fn a_delta_carries_only_the_changed_tiles() {
    let (kn, gn) = cluster(50);
    let mirror = common::mirror("tessera", kn, gn, vec![]);
    let o = tessera_k8s::ui::Observer::new(
        mirror.clone(),
        Arc::new(tessera_k8s::metrics::Metrics::new()),
    );
    o.observe(1_000);
    let mut rx = o.subscribe();
    assert!(place(
        &mut mirror.lock(),
        pod("ml", "a", "uid-a", &[("tessera.io/gpu", "1")]),
        "node-00017"
    ));
    o.observe(3_000);
    let (seq, delta) = rx.try_recv().expect("a delta per tick");
    let delta: serde_json::Value = serde_json::from_str(&delta).unwrap();
    let names: Vec<&str> = delta["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["n"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["node-00017"]);
    assert_eq!(delta["sum"]["allocatedMilli"], 1000);
    // The full frame of the same tick has every tile and the same sequence number.
    let (full_seq, full) = o.full();
    assert_eq!(full_seq, seq);
    let full: serde_json::Value = serde_json::from_str(&full).unwrap();
    assert_eq!(full["nodes"].as_array().unwrap().len(), 50);
    // Nothing changed: an empty delta.
    o.observe(5_000);
    let (_, quiet) = rx.try_recv().unwrap();
    let quiet: serde_json::Value = serde_json::from_str(&quiet).unwrap();
    assert_eq!(quiet["nodes"].as_array().unwrap().len(), 0);
}

/// What the mirror finds wrong (here a pod bound to a node Tessera does not
/// know) is on the page's frames, counted in the summary and in
/// `tessera_problems`, and gone from all three once it is mended.
#[test]
fn the_frames_list_the_mirror_s_problems() {
    let (kn, gn) = cluster(4);
    let mirror = common::mirror("tessera", kn, gn, vec![]);
    let metrics = Arc::new(tessera_k8s::metrics::Metrics::new());
    let o = tessera_k8s::ui::Observer::new(mirror.clone(), metrics.clone());
    o.observe(1_000);
    let full: serde_json::Value = serde_json::from_str(&o.full().1).unwrap();
    assert_eq!(full["sum"]["problems"], 0);
    assert!(full.get("problems").is_none(), "{}", full["problems"]);

    let mut ghost = pod("ml", "lost", "uid-lost", &[("tessera.io/gpu", "1")]);
    ghost.spec.as_mut().unwrap().node_name = Some("node-gone".into());
    mirror.lock().upsert_pod(ghost);
    o.observe(3_000);
    let full: serde_json::Value = serde_json::from_str(&o.full().1).unwrap();
    assert_eq!(full["sum"]["problems"], 1);
    let listed = full["problems"][0].as_str().unwrap_or_default();
    assert!(
        listed.contains("ml/lost") && listed.contains("node-gone"),
        "{listed}"
    );
    let scraped = metrics.encode().unwrap();
    assert!(scraped.contains("tessera_problems 1"), "{scraped}");

    mirror.lock().remove_pod("uid-lost");
    o.observe(5_000);
    let full: serde_json::Value = serde_json::from_str(&o.full().1).unwrap();
    assert_eq!(full["sum"]["problems"], 0);
    assert!(metrics.encode().unwrap().contains("tessera_problems 0"));
}
