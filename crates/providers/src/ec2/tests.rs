use super::*;
use serde_json::json;

#[test]
fn offer_keys_round_trip_and_refuse_what_is_not_one() {
    let key = OfferKey {
        instance_type: "m5.large".into(),
        zone: "us-east-1a".into(),
        purchase: Purchase::Spot,
    };
    assert_eq!(key.to_string(), "m5.large/us-east-1a/spot");
    assert_eq!("m5.large/us-east-1a/spot".parse::<OfferKey>(), Ok(key));
    for bad in [
        "",
        "m5.large",
        "m5.large/us-east-1a",
        "m5.large/us-east-1a/reserved",
        "a/b/spot/x",
    ] {
        assert!(bad.parse::<OfferKey>().is_err(), "{bad:?}");
    }
}

#[test]
fn the_rfc_example_values_make_launch_settings() {
    let config = json!({
        "scalingRatio": 1,
        "ec2": {"ImageId": "ami-12345abcdef", "SubnetID": "sn-302433abcdef"}
    });
    let settings = LaunchSettings::from_launch_config(&config).expect("settings");
    assert_eq!(settings.image_id, "ami-12345abcdef");
    assert_eq!(settings.subnet_id.as_deref(), Some("sn-302433abcdef"));
}

#[test]
fn every_launch_setting_is_read() {
    let config = json!({"ec2": {
        "ImageId": "ami-1",
        "SubnetId": "subnet-1",
        "SecurityGroupIds": ["sg-1", "sg-2"],
        "IamInstanceProfile": {"Arn": "arn:aws:iam::1:instance-profile/ci"},
        "KeyName": "ops",
        "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 100, "VolumeType": "gp3", "Encrypted": true}}],
        "Tags": {"team": "build"},
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1}
    }});
    let settings = LaunchSettings::from_launch_config(&config).expect("settings");
    assert_eq!(
        settings,
        LaunchSettings {
            image_id: "ami-1".into(),
            subnet_id: Some("subnet-1".into()),
            security_group_ids: vec!["sg-1".into(), "sg-2".into()],
            iam_instance_profile: Some("arn:aws:iam::1:instance-profile/ci".into()),
            key_name: Some("ops".into()),
            block_devices: vec![BlockDevice {
                device_name: "/dev/xvda".into(),
                volume_size: Some(100),
                volume_type: Some("gp3".into()),
                encrypted: Some(true),
                ..BlockDevice::default()
            }],
            tags: BTreeMap::from([("team".into(), "build".into())]),
            metadata: Some(MetadataOptions {
                http_tokens: Some("required".into()),
                hop_limit: Some(1),
                http_endpoint: None,
            }),
        }
    );
}

#[test]
fn wrong_launch_settings_are_named() {
    let cases = [
        (json!({}), "no ec2 object"),
        (json!({"ec2": {}}), "ec2.ImageId is required"),
        (
            json!({"ec2": {"ImageId": "ami-1", "ImageID": "x"}}),
            "ec2.ImageID is not a launch setting",
        ),
        (
            json!({"ec2": {"ImageId": "ami-1", "InstanceType": "m5.large"}}),
            "comes from the offer",
        ),
        (
            json!({"ec2": {"ImageId": "ami-1", "SecurityGroupIds": "sg-1"}}),
            "list of strings",
        ),
        (
            json!({"ec2": {"ImageId": "ami-1", "Tags": {"runway:pool": "x"}}}),
            "runway's own",
        ),
        (
            json!({"ec2": {"ImageId": "ami-1", "BlockDeviceMappings": [{"Ebs": {}}]}}),
            "BlockDeviceMappings[0].DeviceName",
        ),
        (
            json!({"ec2": {"ImageId": "ami-1", "SubnetId": "a", "SubnetID": "b"}}),
            "differ",
        ),
    ];
    for (config, expected) in cases {
        let error = LaunchSettings::from_launch_config(&config).expect_err("refused");
        assert!(error.contains(expected), "{config}: {error}");
    }
}

#[test]
fn user_data_exports_the_bootstrap_quoted_and_powers_off() {
    let bootstrap = BTreeMap::from([
        ("RUNWAY_URL".to_owned(), "http://10.0.0.1:8080".to_owned()),
        ("RUNWAY_RUNNER_LABELS".to_owned(), "it's,linux".to_owned()),
    ]);
    let script = user_data(&bootstrap, default_boot_command(&bootstrap));
    assert_eq!(
        script,
        "#!/bin/sh\n# runway: this machine's runner bootstrap\n\
         export RUNWAY_RUNNER_LABELS='it'\\''s,linux'\n\
         export RUNWAY_URL='http://10.0.0.1:8080'\n\
         runway agent --once\nshutdown -h now\n"
    );
    let jit = BTreeMap::from([("RUNWAY_JIT_CONFIG".to_owned(), "abc".to_owned())]);
    assert!(default_boot_command(&jit).contains("run.sh --jitconfig"));
}

#[test]
fn interruptions_halve_reliability() {
    assert_eq!(interruption_reliability(0), 1.0);
    assert_eq!(interruption_reliability(1), 0.5);
    assert_eq!(interruption_reliability(2), 0.25);
    assert_eq!(interruption_reliability(100), 0.05);
}

#[test]
fn error_codes_that_settings_cause_are_permanent() {
    for code in [
        "InvalidAMIID.NotFound",
        "InvalidSubnetID.NotFound",
        "UnauthorizedOperation",
        "InvalidParameterValue",
    ] {
        assert!(is_permanent(code), "{code}");
    }
    for code in [
        "InsufficientInstanceCapacity",
        "SpotMaxPriceTooLow",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "RequestLimitExceeded",
        "",
    ] {
        assert!(!is_permanent(code), "{code}");
    }
}

#[test]
fn client_tokens_are_stable_and_short() {
    let token = client_token("5f0c6a2e-1111-2222-3333-444444444444", "linux-0000abcd");
    assert_eq!(token, "5f0c6a2e-linux-0000abcd");
    assert!(client_token("c", &"x".repeat(100)).len() <= 64);
}
