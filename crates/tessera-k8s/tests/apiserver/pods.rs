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

/// `POST pods/NAME/eviction` with no PodDisruptionBudget in the way (the
/// double keeps none): the pod gets `DisruptionTarget=True`, then is deleted
/// as a DELETE would (file 11: a pending pod is gone at once, a bound one
/// terminates gracefully; a terminating pod is evicted again with 201).
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
