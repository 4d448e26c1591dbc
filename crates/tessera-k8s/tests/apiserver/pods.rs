//! Pod rules: the defaults a create fills in (file 01), what an update may
//! change (files 06, 12), the binding subresource (files 01–04, 12, 16, 17)
//! and deletion (files 04, 08, 16).

use serde_json::{Map, Value, json};

use super::State;
use super::handler::{Req, key, now};
use super::status::{self, ApiError, Cause};
use super::store::{Resource, key_of, rv_of};

/// Defaults the API server adds to a new pod (file 01), as far as a scheduler reads them.
pub fn defaults(pod: &mut Value) {
    if !pod.get("spec").is_some_and(Value::is_object) {
        pod["spec"] = json!({});
    }
    let spec = &mut pod["spec"];
    let mut has_compute = false;
    if let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) {
        for c in containers {
            if let Some(limits) = c
                .pointer("/resources/limits")
                .and_then(Value::as_object)
                .cloned()
            {
                let requests = c["resources"]
                    .as_object_mut()
                    .map(|r| r.entry("requests").or_insert_with(|| json!({})));
                if let Some(Value::Object(req)) = requests {
                    for (k, v) in limits {
                        req.entry(k).or_insert(v);
                    }
                }
            }
            for part in ["requests", "limits"] {
                if let Some(m) = c
                    .pointer(&format!("/resources/{part}"))
                    .and_then(Value::as_object)
                {
                    has_compute |= m.contains_key("cpu") || m.contains_key("memory");
                }
            }
            let c = match c.as_object_mut() {
                Some(c) => c,
                None => continue,
            };
            c.entry("terminationMessagePath")
                .or_insert(json!("/dev/termination-log"));
            c.entry("terminationMessagePolicy").or_insert(json!("File"));
            c.entry("imagePullPolicy").or_insert(json!("IfNotPresent"));
        }
    }
    let Some(s) = spec.as_object_mut() else {
        return;
    };
    s.entry("restartPolicy").or_insert(json!("Always"));
    s.entry("terminationGracePeriodSeconds")
        .or_insert(json!(30));
    s.entry("dnsPolicy").or_insert(json!("ClusterFirst"));
    s.entry("securityContext").or_insert(json!({}));
    s.entry("schedulerName")
        .or_insert(json!("default-scheduler"));
    s.entry("priority").or_insert(json!(0));
    s.entry("enableServiceLinks").or_insert(json!(true));
    s.entry("preemptionPolicy")
        .or_insert(json!("PreemptLowerPriority"));
    let tolerations = s.entry("tolerations").or_insert(json!([]));
    if let Some(t) = tolerations.as_array_mut() {
        for key in [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        ] {
            if !t
                .iter()
                .any(|x| x.get("key").and_then(Value::as_str) == Some(key))
            {
                t.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
            }
        }
    }
    let gated = s
        .get("schedulingGates")
        .and_then(Value::as_array)
        .is_some_and(|g| !g.is_empty());
    let mut st = json!({"phase": "Pending", "qosClass": if has_compute { "Burstable" } else { "BestEffort" }});
    if gated {
        // The API server itself sets this condition on a gated pod (file 12).
        st["conditions"] = json!([{
            "type": "PodScheduled", "status": "False", "lastProbeTime": null,
            "lastTransitionTime": null, "reason": "SchedulingGated",
            "message": "Scheduling is blocked due to non-empty scheduling gates"
        }]);
    }
    pod["status"] = st;
}

fn node_name(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn gate_names(pod: &Value) -> Vec<String> {
    pod.pointer("/spec/schedulingGates")
        .and_then(Value::as_array)
        .map(|g| {
            g.iter()
                .filter_map(|x| x.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

const SPEC_FORBIDDEN: &str = "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// The recorded 422 for a changed `spec.nodeName`, Go diff included (file 06).
fn node_name_forbidden(name: &str, old: &str, new: &str) -> ApiError {
    let nb = "\u{a0}";
    let pad = |v: &str| format!("NodeName:                     \"{v}\",");
    let message = format!(
        "{SPEC_FORBIDDEN}\n{nb}{nb}core.PodSpec{{\n{nb}{nb}\t... // 9 identical fields\n{nb}{nb}\tServiceAccountName:           \"\",\n{nb}{nb}\tAutomountServiceAccountToken: nil,\n-{nb}\t{}\n+{nb}\t{}\n{nb}{nb}\tSecurityContext:              &{{}},\n{nb}{nb}\tImagePullSecrets:             nil,\n{nb}{nb}\t... // 19 identical fields\n{nb}{nb}}}\n",
        pad(old),
        pad(new)
    );
    status::invalid(
        Resource::Pods,
        name,
        vec![Cause {
            reason: "FieldValueForbidden",
            message,
            field: "spec".into(),
        }],
    )
}

/// The parts of a spec an update may change, blanked for comparison.
fn frozen_spec(pod: &Value) -> Value {
    let mut s = pod.get("spec").cloned().unwrap_or(Value::Null);
    if let Some(m) = s.as_object_mut() {
        for f in [
            "activeDeadlineSeconds",
            "tolerations",
            "terminationGracePeriodSeconds",
            "schedulingGates",
            "nodeName",
        ] {
            m.remove(f);
        }
        for list in ["containers", "initContainers"] {
            if let Some(cs) = m.get_mut(list).and_then(Value::as_array_mut) {
                for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                    c.remove("image");
                }
            }
        }
    }
    s
}

/// Applies the pod update strategy to `new` (status kept from `old`, or only
/// status taken for `/status`) and validates what changed.
pub fn prepare_update(old: &Value, new: &mut Value, sub: Option<&str>) -> Result<(), ApiError> {
    let name = key_of(old).1;
    if sub == Some("status") {
        // The status strategy keeps everything but status.
        let status = new.get("status").cloned().unwrap_or(Value::Null);
        let meta = new.get("metadata").cloned();
        *new = old.clone();
        new["status"] = status;
        if let Some(m) = meta {
            new["metadata"] = m;
        }
        return Ok(());
    }
    new["status"] = old.get("status").cloned().unwrap_or(Value::Null);
    let (was, is) = (node_name(old), node_name(new));
    if was != is {
        return Err(node_name_forbidden(&name, was, is));
    }
    let old_gates = gate_names(old);
    for (i, g) in gate_names(new).iter().enumerate() {
        if !old_gates.contains(g) {
            return Err(status::invalid(
                Resource::Pods,
                &name,
                vec![Cause {
                    reason: "FieldValueForbidden",
                    message: format!(
                        "Forbidden: only deletion is allowed, but found new scheduling gate '{g}'"
                    ),
                    field: format!("spec.schedulingGates[{i}].name"),
                }],
            ));
        }
    }
    if frozen_spec(old) != frozen_spec(new) {
        return Err(status::invalid(
            Resource::Pods,
            &name,
            vec![Cause {
                reason: "FieldValueForbidden",
                message: SPEC_FORBIDDEN.into(),
                field: "spec".into(),
            }],
        ));
    }
    Ok(())
}

/// Whether a pod marked for deletion may be removed now: no finalizer holds it
/// and its grace period is over (no kubelet here to end a longer one).
pub fn may_go(pod: &Value) -> bool {
    let terminating = pod
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    let finalizers = pod
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty());
    let grace_over = pod
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64)
        == Some(0);
    terminating && !finalizers && grace_over
}

/// `POST pods/NAME/binding` as `BindingREST.Create` does it.
pub fn bind(st: &mut State, req: &Req<'_>, name: &str) -> Result<Value, ApiError> {
    let binding = req.json()?;
    let meta = binding.get("metadata").cloned().unwrap_or(json!({}));
    let given_name = meta.get("name").and_then(Value::as_str).unwrap_or_default();
    if given_name != name {
        return Err(status::bad_request(
            "name in URL does not match name in Binding object".into(),
        ));
    }
    if let Some(ns) = meta.get("namespace").and_then(Value::as_str)
        && !ns.is_empty()
        && Some(ns) != req.namespace.as_deref()
    {
        return Err(status::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        ));
    }
    let target = binding.get("target").cloned().unwrap_or(json!({}));
    let node = target
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if node.is_empty() {
        return Err(status::internal("target.name: Required value".into()));
    }
    let kind = target
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !kind.is_empty() && kind != "Node" {
        return Err(status::internal(format!(
            "target.kind: Unsupported value: \"{kind}\": supported values: \"Node\", \"<empty>\""
        )));
    }
    let k = key(req, name);
    let Some(old) = st.store.get(Resource::Pods, &k).cloned() else {
        return Err(status::not_found(Resource::Pods, name));
    };
    let ns = k.0.clone();
    let stored_uid = old
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if let Some(uid) = meta.get("uid").and_then(Value::as_str)
        && !uid.is_empty()
        && uid != stored_uid
    {
        return Err(status::precondition_failed(
            &ns, name, "UID", uid, stored_uid,
        ));
    }
    let stored_rv = rv_of(&old).unwrap_or_default();
    if let Some(rv) = meta.get("resourceVersion").and_then(Value::as_str)
        && !rv.is_empty()
        && rv != stored_rv
    {
        return Err(status::precondition_failed(
            &ns,
            name,
            "ResourceVersion",
            rv,
            stored_rv,
        ));
    }
    if old
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
    {
        return Err(status::binding_conflict(
            name,
            format!("pod {name} is being deleted, cannot be assigned to a host"),
        ));
    }
    let assigned = node_name(&old);
    if !assigned.is_empty() {
        return Err(status::binding_conflict(
            name,
            format!("pod {name} is already assigned to node \"{assigned}\""),
        ));
    }
    if !gate_names(&old).is_empty() {
        return Err(status::binding_conflict(
            name,
            format!("pod {name} has non-empty .spec.schedulingGates"),
        ));
    }
    // One write: nodeName, the Binding's annotations and PodScheduled=True.
    let mut pod = (*old).clone();
    pod["spec"]["nodeName"] = json!(node);
    if let Some(Value::Object(extra)) = meta.get("annotations") {
        if !pod["metadata"]
            .get("annotations")
            .is_some_and(Value::is_object)
        {
            pod["metadata"]["annotations"] = Value::Object(Map::new());
        }
        for (k, v) in extra {
            pod["metadata"]["annotations"][k] = v.clone();
        }
    }
    let scheduled = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now()});
    let conditions = pod["status"]
        .as_object_mut()
        .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
    if let Some(Value::Array(cs)) = conditions {
        match cs
            .iter()
            .position(|c| c.get("type").and_then(Value::as_str) == Some("PodScheduled"))
        {
            Some(i) if cs[i].get("status").and_then(Value::as_str) == Some("True") => {}
            Some(i) => cs[i] = scheduled,
            None => cs.push(scheduled),
        }
    }
    st.store.update(Resource::Pods, pod);
    Ok(status::success_201())
}

/// `DELETE pods/NAME` with the grace rules of file 16.
pub fn delete(st: &mut State, req: &Req<'_>, name: &str) -> Result<(u16, Value), ApiError> {
    let opts = if req.body.is_empty() {
        Value::Null
    } else {
        req.json()?
    };
    let k = key(req, name);
    let Some(old) = st.store.get(Resource::Pods, &k).cloned() else {
        return Err(status::not_found(Resource::Pods, name));
    };
    let stored_uid = old
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if let Some(uid) = opts.pointer("/preconditions/uid").and_then(Value::as_str)
        && uid != stored_uid
    {
        return Err(status::delete_precondition(name, "UID", uid, stored_uid));
    }
    let stored_rv = rv_of(&old).unwrap_or_default();
    if let Some(rv) = opts
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        && rv != stored_rv
    {
        return Err(status::delete_precondition(
            name,
            "ResourceVersion",
            rv,
            stored_rv,
        ));
    }
    let asked = req
        .q("gracePeriodSeconds")
        .and_then(|g| g.parse::<i64>().ok())
        .or_else(|| opts.get("gracePeriodSeconds").and_then(Value::as_i64));
    let phase = old
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or_default();
    // Pods never scheduled, and finished pods, need no kubelet to stop them.
    let grace = if node_name(&old).is_empty() || phase == "Succeeded" || phase == "Failed" {
        0
    } else {
        asked.unwrap_or_else(|| {
            old.pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(30)
        })
    };
    let current_grace = old
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64);
    if current_grace.is_some_and(|g| g <= grace) {
        // Already terminating with a grace no longer than asked: unchanged.
        return Ok((200, (*old).clone()));
    }
    let mut pod = (*old).clone();
    let when = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(grace);
    pod["metadata"]["deletionTimestamp"] = json!(when.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    pod["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
    // A delete that takes effect at once costs two resourceVersions: the
    // deletionTimestamp, then the removal (file 08).
    let marked = st.store.update(Resource::Pods, pod);
    if may_go(&marked)
        && let Some(gone) = st.store.delete(Resource::Pods, &k)
    {
        return Ok((200, (*gone).clone()));
    }
    Ok((200, (*marked).clone()))
}

/// A new PodDisruptionBudget as the policy strategy's `PrepareForCreate`
/// leaves it (file 11, step 0): generation 1, status reset to zeros until the
/// disruption controller (which the double does not run) computes it.
pub fn pdb_defaults(pdb: &mut Value) {
    pdb["metadata"]["generation"] = json!(1);
    pdb["status"] = json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0});
}

/// The PodDisruptionBudget strategies on update: the status subresource
/// changes only `status`; the main resource keeps `status` and raises
/// `generation` when `spec` changes (`pkg/registry/policy/poddisruptionbudget/strategy.go`).
pub fn prepare_pdb_update(old: &Value, new: &mut Value, sub: Option<&str>) {
    if sub == Some("status") {
        let status = new.get("status").cloned().unwrap_or(Value::Null);
        let meta = new.get("metadata").cloned();
        *new = old.clone();
        new["status"] = status;
        if let Some(m) = meta {
            new["metadata"] = m;
        }
        new["metadata"]["generation"] = old
            .pointer("/metadata/generation")
            .cloned()
            .unwrap_or(json!(1));
        return;
    }
    new["status"] = old.get("status").cloned().unwrap_or(Value::Null);
    let generation = old
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let bumped = if new.get("spec") != old.get("spec") {
        generation + 1
    } else {
        generation
    };
    new["metadata"]["generation"] = json!(bumped);
}

/// `metav1.LabelSelector` as `metav1.LabelSelectorAsSelector` reads it: an
/// empty selector (`{}`) matches every pod, a missing one none (policy/v1).
fn selects(selector: Option<&Value>, labels: &Map<String, Value>) -> bool {
    let Some(sel) = selector.filter(|s| s.is_object()) else {
        return false;
    };
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    let matched = sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .all(|(k, v)| label(k) == v.as_str());
    let expressions = sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
            let values: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e
                .get("operator")
                .and_then(Value::as_str)
                .unwrap_or_default()
            {
                "In" => label(key).is_some_and(|v| values.contains(&v)),
                "NotIn" => label(key).is_none_or(|v| !values.contains(&v)),
                "Exists" => label(key).is_some(),
                "DoesNotExist" => label(key).is_none(),
                _ => false,
            }
        });
    matched && expressions
}

fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            c.get("type").and_then(Value::as_str) == Some("Ready")
                && c.get("status").and_then(Value::as_str) == Some("True")
        })
}

fn int_at(v: &Value, pointer: &str) -> i64 {
    v.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

/// `EvictionREST.Create`'s PodDisruptionBudget check
/// (`pkg/registry/core/pod/storage/eviction.go`, v1.28–v1.36), for a pod it
/// does not skip: the budgets of the pod's namespace selecting it (more than
/// one: 500); a pod that is not Ready passes under `AlwaysAllow`, or under the
/// default `IfHealthyBudget` while `currentHealthy >= desiredHealthy > 0`;
/// otherwise `checkAndDecrement`: an unprocessed budget
/// (`observedGeneration < generation`) is 429 with `Retry-After: 10`, a
/// negative `disruptionsAllowed` 403, none left 429 (file 11), and an allowed
/// eviction takes one, records the pod in `disruptedPods` and flips the
/// `DisruptionAllowed` condition at zero, in one write of the budget.
fn check_budgets(st: &mut State, pod: &Value, name: &str) -> Result<(), ApiError> {
    let ns = key_of(pod).0;
    let labels = pod
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let budgets: Vec<Value> = st
        .store
        .all(Resource::PodDisruptionBudgets)
        .filter(|b| key_of(b).0 == ns && selects(b.pointer("/spec/selector"), &labels))
        .map(|b| (**b).clone())
        .collect();
    let pdb = match budgets.as_slice() {
        [] => return Ok(()),
        [one] => one.clone(),
        _ => {
            // errors.NewInternalError(...): a 500 `InternalError`.
            return Err(status::injected(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
    };
    let pdb_name = key_of(&pdb).1;
    if !pod_ready(pod) {
        let policy = pdb
            .pointer("/spec/unhealthyPodEvictionPolicy")
            .and_then(Value::as_str);
        let current = int_at(&pdb, "/status/currentHealthy");
        let desired = int_at(&pdb, "/status/desiredHealthy");
        if policy == Some("AlwaysAllow") || (current >= desired && desired > 0) {
            return Ok(());
        }
    }
    if int_at(&pdb, "/status/observedGeneration") < int_at(&pdb, "/metadata/generation") {
        return Err(status::disruption_budget(
            format!("The disruption budget {pdb_name} is still being processed by the server."),
            Some(10),
        ));
    }
    let allowed = int_at(&pdb, "/status/disruptionsAllowed");
    if allowed < 0 {
        return Err(status::forbidden(
            Resource::PodDisruptionBudgets,
            &pdb_name,
            "pdb disruptions allowed is negative",
        ));
    }
    let disrupted = pdb
        .pointer("/status/disruptedPods")
        .and_then(Value::as_object)
        .map_or(0, Map::len);
    if disrupted > 2000 {
        return Err(status::forbidden(
            Resource::PodDisruptionBudgets,
            &pdb_name,
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        ));
    }
    if allowed == 0 {
        return Err(status::disruption_budget(
            format!(
                "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                int_at(&pdb, "/status/desiredHealthy"),
                int_at(&pdb, "/status/currentHealthy")
            ),
            None,
        ));
    }
    let mut pdb = pdb;
    pdb["status"]["disruptionsAllowed"] = json!(allowed - 1);
    if !pdb["status"]
        .get("disruptedPods")
        .is_some_and(Value::is_object)
    {
        pdb["status"]["disruptedPods"] = json!({});
    }
    pdb["status"]["disruptedPods"][name] = json!(now());
    if allowed - 1 == 0 {
        // pdbhelper.UpdateDisruptionAllowedCondition.
        let generation = int_at(&pdb, "/metadata/generation");
        let condition = json!({"type": "DisruptionAllowed", "status": "False",
            "observedGeneration": generation, "lastTransitionTime": now(),
            "reason": "InsufficientPods", "message": ""});
        let conditions = pdb["status"]
            .as_object_mut()
            .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
        if let Some(Value::Array(cs)) = conditions {
            match cs
                .iter()
                .position(|c| c.get("type").and_then(Value::as_str) == Some("DisruptionAllowed"))
            {
                Some(i) if cs[i].get("status").and_then(Value::as_str) == Some("False") => {
                    cs[i]["reason"] = json!("InsufficientPods");
                }
                Some(i) => cs[i] = condition,
                None => cs.push(condition),
            }
        }
    }
    st.store.update(Resource::PodDisruptionBudgets, pdb);
    Ok(())
}

/// `POST pods/NAME/eviction`: the pod gets `DisruptionTarget=True`, then is
/// deleted as a DELETE would (file 11: a pending pod is gone at once, a bound
/// one terminates gracefully; a terminating pod is evicted again with 201).
/// A pod that is Succeeded, Failed, Pending or terminating skips the budgets
/// (`canIgnorePDB`); any other goes through [`check_budgets`].
pub fn evict(st: &mut State, req: &Req<'_>, name: &str) -> Result<Value, ApiError> {
    let k = key(req, name);
    let Some(old) = st.store.get(Resource::Pods, &k).cloned() else {
        return Err(status::not_found(Resource::Pods, name));
    };
    if old
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
    {
        return Ok(status::success_201());
    }
    let phase = old
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !matches!(phase, "Succeeded" | "Failed" | "Pending") {
        check_budgets(st, &old, name)?;
    }
    let mut pod = (*old).clone();
    let target = json!({"type": "DisruptionTarget", "status": "True", "lastProbeTime": null,
        "lastTransitionTime": now(), "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"});
    let conditions = pod["status"]
        .as_object_mut()
        .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
    if let Some(Value::Array(cs)) = conditions {
        cs.retain(|c| c.get("type").and_then(Value::as_str) != Some("DisruptionTarget"));
        cs.push(target);
    }
    st.store.update(Resource::Pods, pod);
    let no_body = Req {
        method: "DELETE",
        resource: Resource::Pods,
        namespace: req.namespace.clone(),
        name: req.name.clone(),
        sub: None,
        query: Default::default(),
        content_type: String::new(),
        body: &[],
    };
    delete(st, &no_body, name)?;
    Ok(status::success_201())
}

/// The PriorityClasses kube-apiserver creates at start (`scheduling.SystemPriorityClasses`),
/// which the double does not store: name, value.
const SYSTEM_PRIORITY_CLASSES: &[(&str, i64)] = &[
    ("system-node-critical", 2_000_001_000),
    ("system-cluster-critical", 2_000_000_000),
];

/// The Priority admission plugin on a pod create
/// (`plugin/pkg/admission/priority/admission.go`, `admitPod`), on the API
/// path only (objects a test seeds with [`super::ApiServer::create`] are
/// stored as if admitted long ago): a named `priorityClassName` is resolved,
/// and one that names no class is refused with 403 `pods "x" is forbidden:
/// no PriorityClass with name y was found`; without a name the
/// `globalDefault` class (the lowest such) applies, else priority 0. The
/// class's value becomes `spec.priority` and its `preemptionPolicy` the
/// pod's; a pod that sends a different `spec.priority` or `preemptionPolicy`
/// is refused (403) as the plugin does.
pub fn admit_priority(st: &State, pod: &mut Value) -> Result<(), ApiError> {
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .or_else(|| {
            pod.pointer("/metadata/generateName")
                .and_then(Value::as_str)
        })
        .unwrap_or("Unknown")
        .to_string();
    if !pod.get("spec").is_some_and(Value::is_object) {
        pod["spec"] = json!({});
    }
    let class_name = pod
        .pointer("/spec/priorityClassName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let class_of = |c: &Value| {
        (
            key_of(c).1,
            c.get("value").and_then(Value::as_i64).unwrap_or(0),
            c.get("preemptionPolicy")
                .and_then(Value::as_str)
                .map(str::to_string)
                // The PriorityClass defaulting fills PreemptLowerPriority.
                .or_else(|| Some("PreemptLowerPriority".to_string())),
        )
    };
    let (class, priority, policy) = if class_name.is_empty() {
        // getDefaultPriority: the global default with the lowest value.
        let default = st
            .store
            .all(Resource::PriorityClasses)
            .filter(|c| c.get("globalDefault").and_then(Value::as_bool) == Some(true))
            .map(|c| class_of(c))
            .min_by_key(|(_, v, _)| *v);
        default.unwrap_or_default()
    } else if let Some(c) = st.store.get(
        Resource::PriorityClasses,
        &(String::new(), class_name.clone()),
    ) {
        class_of(c)
    } else if let Some((n, v)) = SYSTEM_PRIORITY_CLASSES
        .iter()
        .find(|(n, _)| *n == class_name)
    {
        (n.to_string(), *v, Some("PreemptLowerPriority".to_string()))
    } else {
        return Err(status::forbidden(
            Resource::Pods,
            &name,
            &format!("no PriorityClass with name {class_name} was found"),
        ));
    };
    if let Some(given) = pod.pointer("/spec/priority").and_then(Value::as_i64)
        && given != priority
    {
        return Err(status::forbidden(
            Resource::Pods,
            &name,
            &format!(
                "the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {priority} from the given PriorityClass name"
            ),
        ));
    }
    if !class.is_empty() {
        pod["spec"]["priorityClassName"] = json!(class);
    }
    pod["spec"]["priority"] = json!(priority);
    if let Some(policy) = policy {
        if let Some(given) = pod
            .pointer("/spec/preemptionPolicy")
            .and_then(Value::as_str)
            && given != policy
        {
            return Err(status::forbidden(
                Resource::Pods,
                &name,
                &format!(
                    "the string value of PreemptionPolicy ({given}) must not be provided in pod spec; priority admission controller computed {policy} from the given PriorityClass name"
                ),
            ));
        }
        pod["spec"]["preemptionPolicy"] = json!(policy);
    }
    Ok(())
}
