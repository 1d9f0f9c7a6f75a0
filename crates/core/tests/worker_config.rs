//! Properties of worker-configuration evaluation.

use std::collections::BTreeMap;

use proptest::prelude::*;
use runway_core::worker_config::{
    ConditionSet, ProviderSchema, Rule, Schemas, WorkerConfig, WorkerConfigError,
};
use serde_json::{json, Value};

fn rule(id: &str, conditions: Option<Vec<ConditionSet>>, values: Value) -> Rule {
    Rule {
        rule_id: id.to_owned(),
        description: String::new(),
        conditions,
        values,
    }
}

fn config(rules: Vec<Rule>) -> WorkerConfig {
    WorkerConfig {
        id: "c".into(),
        pools: vec!["p".into()],
        rules,
    }
}

fn inputs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn when(pairs: &[(&str, &[&str])]) -> ConditionSet {
    pairs
        .iter()
        .map(|(k, globs)| {
            (
                (*k).to_owned(),
                globs.iter().map(|g| (*g).to_owned()).collect(),
            )
        })
        .collect()
}

/// Small JSON objects over a few keys, so rules collide often.
fn values() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<i32>().prop_map(Value::from),
        "[a-c]{0,2}".prop_map(Value::from),
    ];
    let key = prop::sample::select(vec!["a", "b", "c"]);
    let inner = prop::collection::btree_map(key.clone(), leaf.clone(), 0..3)
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()));
    prop::collection::btree_map(key, prop_oneof![leaf, inner], 0..3)
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
}

fn condition() -> impl Strategy<Value = Option<Vec<ConditionSet>>> {
    prop_oneof![
        Just(None),
        prop::sample::select(vec!["ec2", "gcp", "ec*", "*"])
            .prop_map(|g| Some(vec![when(&[("provider", &[g])])])),
        prop::sample::select(vec!["us-*", "eu-west-1"])
            .prop_map(|g| Some(vec![when(&[("region", &[g])])])),
    ]
}

fn rules() -> impl Strategy<Value = Vec<Rule>> {
    prop::collection::vec((condition(), values()), 0..6).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (conditions, values))| rule(&format!("r{i}"), conditions, values))
            .collect()
    })
}

proptest! {
    #[test]
    fn evaluation_is_deterministic(rules in rules()) {
        let config = config(rules);
        let input = inputs(&[("provider", "ec2"), ("region", "us-east-1")]);
        let first = config.evaluate(&input, &Schemas::default()).unwrap();
        let second = config.clone().evaluate(&input, &Schemas::default()).unwrap();
        prop_assert_eq!(first, second);
    }

    #[test]
    fn rules_that_do_not_match_change_nothing(rules in rules(), extra in values(), position in 0usize..6) {
        let input = inputs(&[("provider", "ec2"), ("region", "us-east-1")]);
        let base = config(rules.clone()).evaluate(&input, &Schemas::default()).unwrap();
        let mut with_extra = rules;
        let never = rule("never", Some(vec![when(&[("provider", &["azure"])])]), extra);
        with_extra.insert(position.min(with_extra.len()), never);
        let after = config(with_extra).evaluate(&input, &Schemas::default()).unwrap();
        prop_assert_eq!(base.values, after.values);
    }

    #[test]
    fn a_later_rule_overrides_an_earlier_one(rules in rules(), first in any::<i32>(), second in any::<i32>()) {
        let mut all = rules;
        all.push(rule("earlier", None, json!({"key": first, "nested": {"x": first}})));
        all.push(rule("later", None, json!({"key": second, "nested": {"x": second}})));
        let result = config(all).evaluate(&BTreeMap::new(), &Schemas::default()).unwrap();
        prop_assert_eq!(&result.values["key"], &json!(second));
        prop_assert_eq!(&result.values["nested"]["x"], &json!(second));
        prop_assert_eq!(result.set_by.get("key").map(String::as_str), Some("later"));
    }

    #[test]
    fn null_deletes(rules in rules(), nested in any::<bool>()) {
        let mut all = rules;
        all.push(rule("set", None, json!({"gone": {"deep": 1}, "kept": 2})));
        let deletion = if nested { json!({"gone": {"deep": null}}) } else { json!({"gone": null}) };
        all.push(rule("delete", None, deletion));
        let result = config(all).evaluate(&BTreeMap::new(), &Schemas::default()).unwrap();
        if nested {
            prop_assert_eq!(&result.values["gone"], &json!({}));
        } else {
            prop_assert!(result.values.get("gone").is_none());
        }
        prop_assert_eq!(&result.values["kept"], &json!(2));
        prop_assert!(!result.set_by.contains_key("gone.deep"));
    }
}

#[test]
fn any_condition_object_may_hold_and_all_names_in_it_must() {
    let config = config(vec![rule(
        "r",
        Some(vec![
            when(&[("provider", &["ec2"]), ("region", &["us-*"])]),
            when(&[("provider", &["gcp", "azure"])]),
        ]),
        json!({"hit": true}),
    )]);
    let hit = |pairs: &[(&str, &str)]| {
        config
            .evaluate(&inputs(pairs), &Schemas::default())
            .unwrap()
            .values
            .get("hit")
            .is_some()
    };
    assert!(hit(&[("provider", "ec2"), ("region", "us-west-2")]));
    assert!(!hit(&[("provider", "ec2"), ("region", "eu-west-1")]));
    assert!(
        !hit(&[("provider", "ec2")]),
        "a missing input does not match"
    );
    assert!(hit(&[("provider", "azure")]));
}

#[test]
fn load_time_errors_name_the_rule() {
    let schemas = Schemas {
        providers: vec![ProviderSchema {
            name: "ec2".into(),
            conditions: vec!["availabilityZone".into()],
            required_keys: vec!["ec2.ImageId".into()],
        }],
    };
    let undeclared = config(vec![rule(
        "zones",
        Some(vec![when(&[("provider", &["ec2"]), ("zone", &["a"])])]),
        json!({}),
    )]);
    let error = undeclared.check(&schemas).unwrap_err();
    assert!(
        matches!(&error, WorkerConfigError::UnknownCondition { rule_id, name, .. } if rule_id == "zones" && name == "zone"),
        "{error}"
    );
    let declared = config(vec![rule(
        "zones",
        Some(vec![when(&[
            ("provider", &["ec2"]),
            ("availabilityZone", &["us-east-1a"]),
        ])]),
        json!({}),
    )]);
    assert_eq!(declared.check(&schemas), Ok(()));
    assert_eq!(
        declared.check(&Schemas::default()),
        Ok(()),
        "standalone accepts any name"
    );
    let bad_glob = config(vec![rule(
        "g",
        Some(vec![when(&[("region", &["us-[east"])])]),
        json!({}),
    )]);
    assert!(matches!(
        bad_glob.check(&Schemas::default()),
        Err(WorkerConfigError::BadGlob { .. })
    ));
    let twice = config(vec![rule("x", None, json!({})), rule("x", None, json!({}))]);
    assert!(matches!(
        twice.check(&Schemas::default()),
        Err(WorkerConfigError::DuplicateRuleId { .. })
    ));

    let empty_ami = config(vec![rule("ami", None, json!({"ec2": {"ImageId": ""}}))]);
    let error = empty_ami
        .evaluate(&inputs(&[("provider", "ec2")]), &schemas)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "the result for provider \"ec2\" has an empty \"ec2.ImageId\", set by rule \"ami\""
    );
    let no_ami = config(vec![rule("base", None, json!({"a": 1}))]);
    let error = no_ami
        .evaluate(&inputs(&[("provider", "ec2")]), &schemas)
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("lacks required key \"ec2.ImageId\""),
        "{error}"
    );
}

#[test]
fn the_scaling_ratio_is_the_last_applying_rules_and_bad_ones_are_refused() {
    let rules = config(vec![
        rule("base", None, json!({"scalingRatio": 1})),
        rule(
            "big",
            Some(vec![when(&[("pool", &["big-*"])])]),
            json!({"scalingRatio": 0.5}),
        ),
        rule(
            "unset",
            Some(vec![when(&[("pool", &["big-free"])])]),
            json!({"scalingRatio": null}),
        ),
        rule(
            "zone",
            Some(vec![when(&[("availabilityZone", &["*"])])]),
            json!({"scalingRatio": 3}),
        ),
    ]);
    type Inputs<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Inputs, Option<f64>); 4] = [
        (&[("pool", "small")], Some(1.0)),
        (&[("pool", "big-gpu")], Some(0.5)),
        (&[("pool", "big-free")], None),
        (&[("pool", "small"), ("availabilityZone", "a")], Some(3.0)),
    ];
    for (given, want) in cases {
        let given = inputs(given);
        assert_eq!(rules.scaling_ratio(&given), want, "{given:?}");
        // The same answer a whole evaluation gives.
        let evaluated = rules.evaluate(&given, &Schemas::default()).unwrap();
        assert_eq!(
            evaluated.values.get("scalingRatio").and_then(Value::as_f64),
            want
        );
    }
    for bad in [json!(0), json!(-1), json!(101), json!("2"), json!(true)] {
        let config = config(vec![rule("r", None, json!({"scalingRatio": bad}))]);
        let error = config.check(&Schemas::default()).unwrap_err();
        assert!(
            matches!(&error, WorkerConfigError::BadScalingRatio { rule_id, .. } if rule_id == "r"),
            "{bad}: {error}"
        );
    }
}
