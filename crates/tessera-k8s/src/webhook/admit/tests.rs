use super::*;
use crate::webhook::UserInfo;
use tessera_core::model::Catalog;

const SA: &str = "system:serviceaccount:tessera-system:tessera-scheduler";

/// A pod `ml/p` with one container `c` asking `resources`.
fn pod(resources: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": resources}}]}
    })
}

fn with(mut pod: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("a JSON pointer");
    let slot = pod.pointer_mut(parent).expect("parent exists");
    slot[key] = value;
    pod
}

fn request(op: &str, object: Value, old: Option<Value>, user: &str) -> AdmissionRequest {
    AdmissionRequest {
        uid: "req-1".into(),
        operation: op.into(),
        user_info: UserInfo {
            username: user.into(),
        },
        object: Some(object),
        old_object: old,
        ..AdmissionRequest::default()
    }
}

fn config() -> WebhookConfig {
    WebhookConfig {
        scheduler_name: None,
        served_scheduler_names: Vec::new(),
        set_scheduler_name: false,
        allocation_writers: vec![SA.into()],
        catalog: Catalog::default(),
        tolerated_taints: Vec::new(),
        claims_client: None,
    }
}

fn standalone() -> WebhookConfig {
    WebhookConfig {
        scheduler_name: Some("tessera".into()),
        set_scheduler_name: true,
        ..config()
    }
}

fn message(r: &AdmissionResponse) -> &str {
    r.message()
        .unwrap_or_else(|| panic!("a denial with a message: {r:?}"))
}

fn patch_of(r: &AdmissionResponse) -> Option<Value> {
    let b64 = r.patch.as_ref()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64 patch");
    Some(serde_json::from_slice(&bytes).expect("JSON patch"))
}

#[test]
fn malformed_requests_are_denied_with_the_parser_message() {
    let c = config();
    let cases = [
        (json!({"tessera.io/gpu": "one"}), "tessera.io/gpu"),
        (
            json!({"tessera.io/gpu": "1", "tessera.io/gpu-memory": "-1Gi"}),
            "tessera.io/gpu-memory",
        ),
        (
            json!({"tessera.io/mig-5g.99gb": "1"}),
            "unknown MIG profile",
        ),
        (
            json!({"tessera.io/gpu": "1", "tessera.io/gpu-cores": "150"}),
            "between 1 and 100",
        ),
    ];
    for (res, want) in cases {
        let r = validate(
            &c,
            &request("CREATE", pod(res.clone(), json!({})), None, "alice"),
        );
        assert!(!r.allowed, "{res}");
        let m = message(&r);
        assert!(m.contains(want) && m.contains("ml/p"), "{res}: {m}");
    }
    let ok = validate(
        &c,
        &request(
            "CREATE",
            pod(json!({"tessera.io/gpu": "1"}), json!({})),
            None,
            "alice",
        ),
    );
    assert!(ok.allowed);
    assert!(ok.patch.is_none(), "validation never patches");
}

/// Finding 2: the annotation is the record of what a pod holds, so adding,
/// changing and removing it are the scheduler's alone, on every pod.
#[test]
fn only_the_scheduler_may_set_change_or_remove_the_allocation() {
    let c = config();
    let a = json!({ANNOTATION: "{\"v\":1,\"gpus\":[0]}"});
    let b = json!({ANNOTATION: "{\"v\":1,\"gpus\":[1]}"});
    let none = json!({});
    let gpu = json!({"tessera.io/gpu": "1"});
    let stock = json!({"nvidia.com/gpu": "1"});
    // (op, resources, old annotations, new annotations, user, refused with this verb)
    let cases = [
        ("CREATE", &gpu, None, &a, "alice", Some("set")),
        ("CREATE", &gpu, None, &a, SA, None),
        ("UPDATE", &gpu, Some(&none), &a, "alice", Some("set")),
        ("UPDATE", &gpu, Some(&a), &b, "alice", Some("change")),
        ("UPDATE", &gpu, Some(&a), &none, "alice", Some("remove")),
        ("UPDATE", &stock, Some(&a), &none, "alice", Some("remove")),
        ("UPDATE", &gpu, Some(&a), &none, "", Some("remove")),
        ("UPDATE", &gpu, Some(&a), &none, SA, None),
        ("UPDATE", &gpu, Some(&a), &b, SA, None),
        // A label change that leaves the annotation alone passes.
        ("UPDATE", &gpu, Some(&a), &a, "alice", None),
        ("UPDATE", &gpu, Some(&none), &none, "alice", None),
    ];
    for (op, res, old, new, user, refused) in cases {
        let old = old.map(|o| pod(res.clone(), o.clone()));
        let r = validate(
            &c,
            &request(op, pod(res.clone(), new.clone()), old.clone(), user),
        );
        let case = format!("{op} {res} {old:?} -> {new} by {user:?}");
        match refused {
            None => assert!(r.allowed, "{case}: {r:?}"),
            Some(verb) => {
                assert!(!r.allowed, "{case}");
                let m = message(&r);
                let who = if user.is_empty() {
                    "an unnamed user"
                } else {
                    user
                };
                assert!(
                    m.contains(&format!(
                        "{who} may not {verb} the tessera.io/allocation annotation of pod ml/p"
                    )),
                    "{case}: {m}"
                );
            }
        }
    }
    // An UPDATE must show the old pod, or the change cannot be judged.
    let mut r = request("UPDATE", pod(gpu.clone(), none.clone()), None, "alice");
    let denied = validate(&c, &r);
    assert!(
        message(&denied).contains("carries no oldObject"),
        "{denied:?}"
    );
    r.old_object = Some(json!({"kind": "Pod", "spec": {"containers": "not a list"}}));
    let denied = validate(&c, &r);
    assert!(
        message(&denied).contains("the oldObject is not a valid Pod"),
        "{denied:?}"
    );
}

/// Finding 3: only pods that ask for Tessera (or whose namespace opted in as a
/// whole) get our schedulerName; plain stock GPU pods stay with the default
/// scheduler and the stock device plugin.
#[test]
fn only_pods_that_claim_tessera_get_its_scheduler() {
    let label = |p: Value, v: &str| with(p, "/metadata/labels", json!({SCHEDULE_LABEL: v}));
    let named = |p: Value, n: &str| with(p, "/spec/schedulerName", json!(n));
    let gpu = || pod(json!({"tessera.io/gpu": "1"}), json!({}));
    let stock = || pod(json!({"nvidia.com/gpu": "1"}), json!({}));
    let mig = || pod(json!({"nvidia.com/mig-1g.10gb": "1"}), json!({}));
    let cpu = || pod(json!({"cpu": "1"}), json!({}));
    let init_only = with(
        cpu(),
        "/spec/initContainers",
        json!([{"name": "i", "resources": {"limits": {"tessera.io/gpu-milli": "500"}}}]),
    );
    // (pod, the namespace opted in as a whole, patched)
    let cases = [
        (gpu(), false, true),
        (
            pod(json!({"tessera.io/mig-1g.10gb": "1"}), json!({})),
            false,
            true,
        ),
        (init_only, false, true),
        (stock(), false, false),
        (mig(), false, false),
        (cpu(), false, false),
        (label(stock(), "true"), false, true),
        (label(mig(), "true"), false, true),
        (label(stock(), "false"), false, false),
        (label(cpu(), "true"), false, false),
        (
            pod(
                json!({"nvidia.com/gpu": "1"}),
                json!({"tessera.io/isolation": "exclusive"}),
            ),
            false,
            true,
        ),
        (
            pod(
                json!({"nvidia.com/gpu": "1"}),
                json!({"tessera.io/gpu-model": "A100-80GB"}),
            ),
            false,
            true,
        ),
        (
            pod(
                json!({"nvidia.com/gpu": "1"}),
                json!({"tessera.io/unrelated": "x"}),
            ),
            false,
            false,
        ),
        (named(gpu(), "default-scheduler"), false, true),
        (named(gpu(), ""), false, true),
        // A pod that names its own scheduler is never changed.
        (named(gpu(), "volcano"), false, false),
        (named(label(stock(), "true"), "volcano"), true, false),
        (named(gpu(), "tessera"), false, false),
        // A namespace that opted in: every GPU pod, but still not CPU pods.
        (stock(), true, true),
        (mig(), true, true),
        (cpu(), true, false),
    ];
    let c = standalone();
    for (p, all_gpu_pods, patched) in cases {
        let r = mutate(
            &c,
            &request("CREATE", p.clone(), None, "alice"),
            all_gpu_pods,
        );
        assert!(r.allowed, "{p}: {r:?}");
        let want = patched
            .then(|| json!([{"op": "add", "path": "/spec/schedulerName", "value": "tessera"}]));
        assert_eq!(
            patch_of(&r),
            want,
            "{p} (namespace opted in: {all_gpu_pods})"
        );
        if patched {
            assert_eq!(r.patch_type.as_deref(), Some("JSONPatch"));
        }
    }
    // Not configured to mutate, or not a CREATE: nothing to do.
    let r = mutate(&config(), &request("CREATE", gpu(), None, "alice"), true);
    assert!(r.allowed && r.patch.is_none());
    let r = mutate(&c, &request("UPDATE", gpu(), Some(gpu()), "alice"), true);
    assert!(r.allowed && r.patch.is_none());
    // What is not a pod is denied with the decoder's message, not patched.
    let r = mutate(
        &c,
        &request("CREATE", json!({"spec": 7}), None, "alice"),
        false,
    );
    assert!(
        message(&r).contains("the object is not a valid Pod"),
        "{r:?}"
    );
}

/// Finding 3, validation side: a stock GPU pod is not Tessera's to judge,
/// unless it is placed by Tessera (our schedulerName) or opted in.
#[test]
fn stock_gpu_pods_are_judged_only_when_tessera_places_them() {
    let c = standalone();
    let stock = with(
        pod(json!({"nvidia.com/gpu": "2"}), json!({})),
        "/spec/containers/0/env",
        json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
    );
    let r = validate(&c, &request("CREATE", stock.clone(), None, "alice"));
    assert!(r.allowed, "{r:?}");
    let ours = with(stock.clone(), "/spec/schedulerName", json!("tessera"));
    let r = validate(&c, &request("CREATE", ours, None, "alice"));
    assert!(message(&r).contains("NVIDIA_VISIBLE_DEVICES"), "{r:?}");
    let opted = with(stock, "/metadata/labels", json!({SCHEDULE_LABEL: "true"}));
    let r = validate(&c, &request("CREATE", opted, None, "alice"));
    assert!(message(&r).contains("NVIDIA_VISIBLE_DEVICES"), "{r:?}");
    // A malformed stock request is the stock plugin's business, not a Tessera denial.
    let r = validate(
        &c,
        &request(
            "CREATE",
            pod(json!({"nvidia.com/gpu": "two"}), json!({})),
            None,
            "alice",
        ),
    );
    assert!(r.allowed, "{r:?}");
}

/// Finding 15: a pod Tessera places may not pick its own devices; the denial
/// names the pod, the container and the variable.
#[test]
fn pods_that_choose_their_own_gpus_are_refused() {
    let c = standalone();
    let gpu = || pod(json!({"tessera.io/gpu": "1"}), json!({}));
    let cases = [
        (
            "/spec/containers/0/env",
            json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
            "container \"c\" sets NVIDIA_VISIBLE_DEVICES",
        ),
        (
            "/spec/containers/0/env",
            json!([{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"}]),
            "container \"c\" sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        ),
        (
            "/spec/initContainers",
            json!([{"name": "warm", "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"}]}]),
            "init container \"warm\" sets CUDA_VISIBLE_DEVICES",
        ),
        (
            "/spec/containers/0/env",
            json!([{"name": "TESSERA_ISOLATION", "value": "exclusive"}]),
            "container \"c\" sets TESSERA_ISOLATION",
        ),
        (
            "/spec/containers/0/envFrom",
            json!([{"configMapRef": {"name": "settings"}}]),
            "container \"c\" imports envFrom configMap \"settings\" without a prefix",
        ),
        (
            "/spec/containers/0/volumeMounts",
            json!([{"name": "v", "mountPath": "/var/run/nvidia-container-devices/all"}]),
            "container \"c\" mounts a volume at /var/run/nvidia-container-devices/all",
        ),
    ];
    for (pointer, value, want) in cases {
        let p = with(gpu(), pointer, value.clone());
        let r = validate(&c, &request("CREATE", p, None, "alice"));
        assert!(!r.allowed, "{value}");
        let m = message(&r);
        assert!(
            m.starts_with("Tessera: pod ml/p may not choose its own GPUs") && m.contains(want),
            "{value}: {m}"
        );
    }
    // CPU pods placed by Tessera are held to the same rule.
    let cpu = with(
        with(
            pod(json!({"cpu": "1"}), json!({})),
            "/spec/schedulerName",
            json!("tessera"),
        ),
        "/spec/containers/0/env",
        json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
    );
    assert!(!validate(&c, &request("CREATE", cpu, None, "alice")).allowed);
    // Several breaches are all named.
    let p = with(
        gpu(),
        "/spec/containers/0/env",
        json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
               {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/x"}]),
    );
    let r = validate(&c, &request("CREATE", p, None, "alice"));
    let m = message(&r);
    assert!(
        m.contains("NVIDIA_VISIBLE_DEVICES") && m.contains("CUDA_MPS_PIPE_DIRECTORY"),
        "{m}"
    );
    // Harmless variables and prefixed imports pass.
    let p = with(
        with(
            gpu(),
            "/spec/containers/0/env",
            json!([{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}]),
        ),
        "/spec/containers/0/envFrom",
        json!([{"prefix": "APP_", "secretRef": {"name": "s"}}]),
    );
    assert!(validate(&c, &request("CREATE", p, None, "alice")).allowed);
}

/// Finding 15 on UPDATE: an ephemeral container added to a running GPU pod
/// (`kubectl debug`) is held to the rule; a pod admitted before the rule can
/// still be updated as long as the update adds no breach.
#[test]
fn updates_may_not_add_a_way_to_other_gpus() {
    let c = config();
    let before = pod(json!({"tessera.io/gpu": "1"}), json!({}));
    let debug = with(
        before.clone(),
        "/spec/ephemeralContainers",
        json!([{"name": "dbg", "image": "busybox",
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]),
    );
    let r = validate(&c, &request("UPDATE", debug.clone(), Some(before), "alice"));
    assert!(!r.allowed);
    assert!(
        message(&r).contains("ephemeral container \"dbg\" sets NVIDIA_VISIBLE_DEVICES"),
        "{r:?}"
    );
    let relabelled = with(debug.clone(), "/metadata/labels", json!({"team": "a"}));
    let r = validate(
        &c,
        &request("UPDATE", relabelled, Some(debug.clone()), "alice"),
    );
    assert!(r.allowed, "{r:?}");
    // The scheduler's own annotation write on such a pod is not held up either.
    let annotated = with(
        debug.clone(),
        "/metadata/annotations",
        json!({ANNOTATION: "{}"}),
    );
    let r = validate(&c, &request("UPDATE", annotated, Some(debug), SA));
    assert!(r.allowed, "{r:?}");
}

#[test]
fn other_operations_and_subjects_pass() {
    let c = standalone();
    let r = validate(
        &c,
        &AdmissionRequest {
            uid: "d".into(),
            operation: "DELETE".into(),
            old_object: Some(pod(json!({}), json!({ANNOTATION: "x"}))),
            ..AdmissionRequest::default()
        },
    );
    assert!(r.allowed && r.uid == "d");
    let r = validate(
        &c,
        &request("CREATE", json!({"kind": "Pod", "spec": 7}), None, "alice"),
    );
    assert!(
        message(&r).contains("the object is not a valid Pod"),
        "{r:?}"
    );
    let mut req = request("CREATE", json!({}), None, "alice");
    req.object = None;
    assert!(message(&validate(&c, &req)).contains("carries no object"));
}

/// Without `--webhook-set-scheduler-name` the webhook still knows Tessera's
/// name: a stock `nvidia.com/gpu` pod under `schedulerName: tessera` is
/// Tessera's to check (device variables refused), and nothing is mutated.
#[test]
fn pods_under_our_name_are_checked_even_when_names_are_not_set() {
    let checking = WebhookConfig {
        scheduler_name: Some("tessera".into()),
        set_scheduler_name: false,
        ..config()
    };
    let mut pod = json!({
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"schedulerName": "tessera", "containers": [{"name": "c",
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    });
    let r = validate(&checking, &request("CREATE", pod.clone(), None, "alice"));
    assert!(
        !r.allowed && message(&r).contains("NVIDIA_VISIBLE_DEVICES"),
        "{r:?}"
    );
    pod["spec"]["schedulerName"] = Value::Null;
    pod["metadata"]["labels"] = json!({"tessera.io/schedule": "true"});
    let r = mutate(&checking, &request("CREATE", pod, None, "alice"), false);
    assert!(r.allowed && r.patch.is_none(), "{r:?}");
}

/// Issue 28 item 6: a pod of a schedulerName Tessera also serves
/// (`--serve-scheduler-name default-scheduler`) is placed by Tessera and checked
/// like one under `tessera`; before, only `scheduler_name` was looked at and such
/// a pod could set `NVIDIA_VISIBLE_DEVICES` and pass.
#[test]
fn pods_of_served_scheduler_names_are_checked() {
    let c = WebhookConfig {
        scheduler_name: Some("tessera".into()),
        served_scheduler_names: vec!["default-scheduler".into(), "gpu-batch".into()],
        ..config()
    };
    let stock = with(
        pod(json!({"nvidia.com/gpu": "1"}), json!({})),
        "/spec/containers/0/env",
        json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
    );
    for name in ["default-scheduler", "gpu-batch"] {
        let served = with(stock.clone(), "/spec/schedulerName", json!(name));
        let r = validate(&c, &request("CREATE", served, None, "alice"));
        assert!(
            !r.allowed && message(&r).contains("NVIDIA_VISIBLE_DEVICES"),
            "{name}: {r:?}"
        );
    }
    // A malformed request under a served name gets the parser's message.
    let bad = with(
        pod(json!({"nvidia.com/gpu": "two"}), json!({})),
        "/spec/schedulerName",
        json!("gpu-batch"),
    );
    let r = validate(&c, &request("CREATE", bad, None, "alice"));
    assert!(message(&r).contains("invalid GPU request"), "{r:?}");
    // A scheduler Tessera does not serve is still left alone.
    let other = with(stock, "/spec/schedulerName", json!("volcano"));
    assert!(validate(&c, &request("CREATE", other, None, "alice")).allowed);
}

/// Issue 28 item 6: with CDI on in the runtime, `cdi.k8s.io/*: nvidia.com/gpu=all`
/// on a pod reaches every GPU of its node. Refused on every pod (whoever
/// schedules it), naming the annotation; other vendors' CDI devices pass.
#[test]
fn cdi_annotations_naming_gpus_are_refused_on_every_pod() {
    let c = standalone();
    let cpu = || pod(json!({"cpu": "1"}), json!({}));
    for (key, value) in [
        ("cdi.k8s.io/x", "nvidia.com/gpu=all"),
        (
            "cdi.k8s.io/gpus",
            "vendor.example/net=eth1, nvidia.com/gpu=GPU-0",
        ),
        ("cdi.k8s.io/mig", "nvidia.com/mig=MIG-1"),
        ("cdi.k8s.io/claim", "k8s.gpu.nvidia.com/claim=abc"),
        ("cdi.k8s.io/mgmt", "management.nvidia.com/gpu=all"),
        ("cdi.k8s.io/t", "tessera.io/gpu=0"),
        ("cdi.k8s.io/upper", "NVIDIA.COM/gpu=all"),
    ] {
        for p in [
            with(cpu(), "/metadata/annotations", json!({key: value})),
            with(
                with(cpu(), "/metadata/annotations", json!({key: value})),
                "/spec/schedulerName",
                json!("volcano"),
            ),
            pod(json!({"tessera.io/gpu": "1"}), json!({key: value})),
        ] {
            let r = validate(&c, &request("CREATE", p, None, "alice"));
            assert!(!r.allowed, "{key}: {value}: {r:?}");
            assert!(
                message(&r).contains(&format!("annotation {key} names")),
                "{r:?}"
            );
        }
    }
    // Other vendors' devices, and look-alike vendors, are not GPUs of ours.
    for value in [
        "vendor.example/net=eth1",
        "notnvidia.com/gpu=all",
        "intel.com/gpu=0",
    ] {
        let p = with(
            cpu(),
            "/metadata/annotations",
            json!({"cdi.k8s.io/x": value}),
        );
        let r = validate(&c, &request("CREATE", p, None, "alice"));
        assert!(r.allowed, "{value}: {r:?}");
    }
    // Outside the prefix the value means nothing to the runtime.
    let p = with(
        cpu(),
        "/metadata/annotations",
        json!({"note": "nvidia.com/gpu=all"}),
    );
    assert!(validate(&c, &request("CREATE", p, None, "alice")).allowed);
    // On UPDATE only what the update adds: a pod admitted before the rule can
    // still be relabelled, but not given a new one.
    let old = with(
        cpu(),
        "/metadata/annotations",
        json!({"cdi.k8s.io/x": "nvidia.com/gpu=0"}),
    );
    let relabelled = with(old.clone(), "/metadata/labels", json!({"team": "a"}));
    let r = validate(
        &c,
        &request("UPDATE", relabelled, Some(old.clone()), "alice"),
    );
    assert!(r.allowed, "{r:?}");
    let widened = with(
        old.clone(),
        "/metadata/annotations",
        json!({"cdi.k8s.io/x": "nvidia.com/gpu=all"}),
    );
    let r = validate(&c, &request("UPDATE", widened, Some(old), "alice"));
    assert!(message(&r).contains("names nvidia.com/gpu=all"), "{r:?}");
}

/// Issue 27 item 3: where Tessera's nodes are tainted to keep stock pods off
/// them, the pods the webhook hands to Tessera get the matching toleration;
/// pods that already tolerate it, stock pods left to the default scheduler and
/// other schedulers' pods are not touched. Before, the webhook only set the
/// schedulerName and such pods stayed Pending on tainted nodes.
#[test]
fn pods_handed_to_tessera_get_the_configured_toleration() {
    let taint = toleration::parse_taint("tessera.io/managed=true:NoSchedule").unwrap();
    let want = toleration::toleration_for(&taint);
    let c = WebhookConfig {
        tolerated_taints: vec![taint],
        ..standalone()
    };
    let want = serde_json::to_value(&want).unwrap();
    let gpu = || pod(json!({"tessera.io/gpu": "1"}), json!({}));
    let patch = |p: Value, all_gpu_pods: bool| {
        let r = mutate(
            &c,
            &request("CREATE", p.clone(), None, "alice"),
            all_gpu_pods,
        );
        assert!(r.allowed, "{p}: {r:?}");
        patch_of(&r)
    };
    let name = json!({"op": "add", "path": "/spec/schedulerName", "value": "tessera"});

    // No tolerations yet: the list is added with ours.
    assert_eq!(
        patch(gpu(), false),
        Some(json!([name, {"op": "add", "path": "/spec/tolerations", "value": [want]}]))
    );
    // Tolerations of its own: ours is appended, theirs kept.
    let other = json!([{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]);
    assert_eq!(
        patch(with(gpu(), "/spec/tolerations", other.clone()), false),
        Some(json!([name, {"op": "add", "path": "/spec/tolerations/-", "value": want}]))
    );
    // Already tolerated (same key, or everything): only the name.
    let wide = json!([{"key": "tessera.io/managed", "operator": "Exists"}]);
    assert_eq!(
        patch(with(gpu(), "/spec/tolerations", wide), false),
        Some(json!([name]))
    );
    // Under our name already: the toleration alone.
    assert_eq!(
        patch(with(gpu(), "/spec/schedulerName", json!("tessera")), false),
        Some(json!([{"op": "add", "path": "/spec/tolerations", "value": [want]}]))
    );
    // Another scheduler's pod, and a stock pod not opted in: untouched.
    assert_eq!(
        patch(with(gpu(), "/spec/schedulerName", json!("volcano")), false),
        None
    );
    assert_eq!(
        patch(pod(json!({"nvidia.com/gpu": "1"}), json!({})), false),
        None
    );
    // A namespace that opted in as a whole: its stock pods too.
    assert_eq!(
        patch(pod(json!({"nvidia.com/gpu": "1"}), json!({})), true),
        Some(json!([name, {"op": "add", "path": "/spec/tolerations", "value": [want]}]))
    );
}
