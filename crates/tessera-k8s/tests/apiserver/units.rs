//! Unit tests of the double's parsers and patch formats (kept out of the
//! module files so that every test binary using the double does not run them).

mod select {
    use serde_json::json;

    use crate::apiserver::Resource;
    use crate::apiserver::select::*;

    #[test]
    fn label_forms() {
        let pod = json!({"metadata": {"labels": {"app": "web", "tier": "a"}}});
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&pod);
        assert!(m("app") && m("app=web") && m("app==web") && m("tier in (a,b)"));
        assert!(!m("!app") && !m("app!=web") && !m("tier notin (a)") && !m("case=08"));
        assert!(m("!tessera.io/none") && m(""));
    }

    #[test]
    fn fields_of_pods() {
        let unbound = json!({"metadata": {"name": "p"}, "spec": {"schedulerName": "tessera"}});
        let sel = FieldSelector::parse(Resource::Pods, "spec.schedulerName=tessera,spec.nodeName=")
            .unwrap();
        assert!(sel.matches(Resource::Pods, &unbound));
        let bound = json!({"spec": {"schedulerName": "tessera", "nodeName": "n1"}});
        assert!(!sel.matches(Resource::Pods, &bound));
        let e = FieldSelector::parse(Resource::Pods, "spec.containers.name=main").unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.body["message"],
            "field label not supported: spec.containers.name"
        );
    }
}

mod patch {
    use serde_json::json;

    use crate::apiserver::patch::*;

    #[test]
    fn merge_deletes_with_null() {
        let mut d = json!({"metadata": {"annotations": {"a": "1", "b": "2"}}});
        merge(
            &mut d,
            &json!({"metadata": {"annotations": {"a": null, "c": "3"}}}),
        );
        assert_eq!(
            d,
            json!({"metadata": {"annotations": {"b": "2", "c": "3"}}})
        );
    }

    #[test]
    fn strategic_merges_keyed_lists() {
        let mut d = json!({"spec": {"schedulingGates": [{"name": "a"}, {"name": "b"}]}});
        strategic(
            &mut d,
            &json!({"spec": {"schedulingGates": [{"name": "c"}]}}),
        );
        assert_eq!(d["spec"]["schedulingGates"].as_array().unwrap().len(), 3);
        strategic(
            &mut d,
            &json!({"spec": {"schedulingGates": [{"name": "a", "$patch": "delete"}]}}),
        );
        assert_eq!(
            d["spec"]["schedulingGates"],
            json!([{"name": "c"}, {"name": "b"}])
        );
    }

    #[test]
    fn json_patch_rules_of_file_05() {
        let mut d = json!({"metadata": {"name": "p5"}, "spec": {}});
        let add =
            json!([{"op": "add", "path": "/metadata/annotations/tessera.io~1x", "value": "1"}]);
        assert_eq!(json_patch(&mut d, &add), Err(PatchError::OpFailed));
        let null_ok = json!([{"op": "test", "path": "/spec/nodeName", "value": null}]);
        assert_eq!(json_patch(&mut d, &null_ok), Ok(()));
        let empty = json!([{"op": "test", "path": "/spec/nodeName", "value": ""}]);
        assert_eq!(json_patch(&mut d, &empty), Err(PatchError::OpFailed));
        let novalue = json!([{"op": "test", "path": "/spec/nodeName"}]);
        assert_eq!(json_patch(&mut d, &novalue), Err(PatchError::ServerPanic));
    }
}

mod leases {
    use crate::apiserver::leases::*;

    #[test]
    fn micro_time_needs_six_digits() {
        assert!(is_micro_time("2026-12-01T03:29:59.733369Z"));
        assert!(is_micro_time("2026-12-01T03:29:59.733369+02:00"));
        assert!(!is_micro_time("2026-12-01T03:30:00Z"));
        assert!(!is_micro_time("2026-12-01T03:30:00.123Z"));
        let e = micro_time_error("Lease", "2026-12-01T03:30:00Z");
        assert_eq!(
            e.body["message"],
            "Lease in version \"v1\" cannot be handled as a Lease: parsing time \"2026-12-01T03:30:00Z\" as \"2006-01-02T15:04:05.000000Z07:00\": cannot parse \"Z\" as \".000000\""
        );
    }
}
