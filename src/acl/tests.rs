//! Unit tests of the access rules: grants, token lookup, expiry, header parsing.

use axum::http::{HeaderMap, HeaderValue};

use super::tokens::TokenFile;
use super::*;

fn section(policies: &str) -> AclSection {
    let text = format!("enabled = true\n{policies}");
    let s: AclSection = toml::from_str(&text).unwrap();
    s.validate().unwrap();
    s
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, HeaderValue::from_str(v).unwrap());
    }
    h
}

const ORDERS: &str = r#"
[[policies]]
name = "orders-team"
rules = [{ namespace = "default", service_prefix = "orders", read = true, write = true },
         { namespace = "default", read = true }]
"#;

#[test]
fn grants_follow_namespace_and_service_prefix() {
    let s = section(ORDERS);
    let mut f = TokenFile::default();
    let (_, secret) = f.create(vec!["orders-team".into()], String::new(), 0, None);
    let acl = Acl::new(&s, &f).unwrap();
    let p = acl.authenticate(&headers(&[("authorization", &format!("Bearer {secret}"))]), None, 1).unwrap();
    let w = |ns: &str, svc: &str| Need::Write { namespace: ns.into(), service: svc.into() };
    let r = |ns: &str, svc: Option<&str>| Need::Read { namespace: ns.into(), service: svc.map(Into::into) };
    assert!(p.grants.allows(&w("default", "orders")));
    assert!(p.grants.allows(&w("default", "orders-eu")));
    assert!(!p.grants.allows(&w("default", "payments")));
    assert!(!p.grants.allows(&w("other", "orders")));
    assert!(p.grants.allows(&r("default", Some("payments"))));
    assert!(p.grants.allows(&r("default", None)), "a rule without a prefix lists the namespace");
    assert!(!p.grants.allows(&r("other", None)));
    assert!(
        !p.grants.allows(&Need::Admin) && !p.grants.allows(&Need::Status) && !p.grants.allows(&Need::Metrics)
    );
    assert_eq!(
        p.check(&Need::Admin).unwrap_err().message,
        format!("token {} lacks admin", f.tokens[0].id),
        "a refusal names the missing scope and the token id, never the secret"
    );
}

#[test]
fn only_a_known_unexpired_token_in_the_token_headers_authenticates() {
    let s = section(ORDERS);
    let mut f = TokenFile::default();
    let (_, secret) = f.create(vec![ADMIN_POLICY.into()], String::new(), 0, Some(1_000));
    let acl = Acl::new(&s, &f).unwrap();
    assert_eq!(acl.authenticate(&headers(&[]), None, 1).unwrap_err(), Unauthenticated::NoToken);
    assert_eq!(
        acl.authenticate(&headers(&[("x-tandem-token", "tdm_00")]), None, 1).unwrap_err(),
        Unauthenticated::UnknownToken
    );
    // Other headers grant nothing, whatever they hold.
    for h in ["user-agent", "x-forwarded-for", "cookie", "x-tandem-admin", "host"] {
        assert_eq!(
            acl.authenticate(&headers(&[(h, &secret)]), None, 1).unwrap_err(),
            Unauthenticated::NoToken,
            "{h}"
        );
    }
    assert_eq!(
        acl.authenticate(&headers(&[("authorization", &format!("Basic {secret}"))]), None, 1).unwrap_err(),
        Unauthenticated::NoToken
    );
    assert!(acl.authenticate(&headers(&[("x-tandem-token", &secret)]), None, 999).is_ok());
    assert!(acl
        .authenticate(&headers(&[("authorization", &format!("bearer  {secret} "))]), None, 999)
        .is_ok());
    assert_eq!(
        acl.authenticate(&headers(&[("x-tandem-token", &secret)]), None, 1_000).unwrap_err(),
        Unauthenticated::Expired
    );
    // A prefix or an extension of the secret is another secret.
    assert!(acl.authenticate(&headers(&[("x-tandem-token", &secret[..secret.len() - 1])]), None, 1).is_err());
    assert!(acl.authenticate(&headers(&[("x-tandem-token", &format!("{secret}0"))]), None, 1).is_err());
}

#[test]
fn disabled_acl_lets_everyone_do_everything() {
    let acl = Acl::new(&AclSection::default(), &TokenFile::default()).unwrap();
    let p = acl.authenticate(&headers(&[]), None, 0).unwrap();
    assert!(p.grants.allows(&Need::Admin));
}

#[test]
fn tokens_naming_unknown_policies_and_bad_policies_are_refused() {
    let s = section(ORDERS);
    let mut f = TokenFile::default();
    f.create(vec!["nope".into()], String::new(), 0, None);
    assert!(matches!(Acl::new(&s, &f), Err(AclError::UnknownPolicy { .. })));
    for bad in [
        "[[policies]]\nname = \"admin\"\n",
        "[[policies]]\nname = \"a b\"\n",
        "[[policies]]\nname = \"x\"\nrules = [{ namespace = \"default\" }]\n",
        "[[policies]]\nname = \"x\"\n[[policies]]\nname = \"x\"\n",
    ] {
        let s: AclSection = toml::from_str(&format!("enabled = true\n{bad}")).unwrap();
        assert!(s.validate().is_err(), "{bad}");
    }
}

#[test]
fn the_tokens_file_holds_hashes_only_and_is_private() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    let made = tokens::bootstrap(&path, dir.path(), 5).unwrap().unwrap();
    assert!(tokens::bootstrap(&path, dir.path(), 6).unwrap().is_none(), "only at the first start");
    let secret = std::fs::read_to_string(&made).unwrap().trim().to_owned();
    assert!(secret.starts_with(tokens::SECRET_PREFIX) && secret.len() == 4 + 64);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains(&secret[4..]), "the file never holds the secret");
    for p in [&path, &made] {
        assert_eq!(std::fs::metadata(p).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let acl = Acl::new(&section(""), &TokenFile::load(&path).unwrap()).unwrap();
    assert!(acl.authenticate(&headers(&[("x-tandem-token", &secret)]), None, 7).unwrap().grants.admin);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert!(TokenFile::load(&path).is_err(), "a tokens file others may write is refused");
}

#[test]
fn a_bound_client_certificate_is_a_principal_and_a_token_wins_over_it() {
    let s = section(&format!("{ORDERS}\n[[certs]]\nname = \"orders-bot\"\npolicies = [\"orders-team\"]\n"));
    let mut f = TokenFile::default();
    let (_, secret) = f.create(vec!["admin".into()], String::new(), 0, None);
    let acl = Acl::new(&s, &f).unwrap();
    let p = acl.authenticate(&headers(&[]), Some("orders-bot"), 1).unwrap();
    assert_eq!((&*p.id, &*p.name), ("cert:orders-bot", "cert:orders-bot"));
    let write = |svc: &str| Need::Write { namespace: "default".into(), service: svc.into() };
    assert!(p.grants.allows(&write("orders-api")) && !p.grants.allows(&write("billing")));
    assert!(!p.grants.admin);
    // Bound to nothing: nobody. A token presented decides, whatever the certificate.
    assert_eq!(
        acl.authenticate(&headers(&[]), Some("stranger"), 1).unwrap_err(),
        Unauthenticated::UnboundCert
    );
    let t = acl.authenticate(&headers(&[("x-tandem-token", &secret)]), Some("orders-bot"), 1).unwrap();
    assert!(t.grants.admin);
    assert_eq!(
        acl.authenticate(&headers(&[("x-tandem-token", "tdm_00")]), Some("orders-bot"), 1).unwrap_err(),
        Unauthenticated::UnknownToken
    );
    // A binding to an undefined policy, or twice, does not load.
    let bad: AclSection =
        toml::from_str("enabled = true\n[[certs]]\nname = \"x\"\npolicies = [\"nope\"]\n").unwrap();
    assert!(bad.validate().unwrap_err().1.contains("nope"));
}
