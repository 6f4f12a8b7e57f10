//! Issue 17 (auth half): users, roles and tokens on a real three-node cluster.
//!
//! Every case asserts the exact status code a raw gRPC call gets (and, where the client library
//! is used, its typed error): no token with auth on, an unknown and a forged token, a wrong
//! password, an expired token (a cluster with a 1 s TTL), a user with readwrite on the prefix
//! `a/` writing inside and outside it (PERMISSION_DENIED names the user, the range and the
//! permission), a read-only user's Txn with a write, a non-root user calling member remove, user
//! add, snapshot save, alarm disarm and auth disable, auth enable without root, a token issued
//! by one node accepted by the others and after the leader is killed, the auth state after a
//! full cluster restart and on a node that caught up by snapshot, a password change revoking
//! the old token, and (TLS with client-cert auth) a client certificate's CN as the user.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::time::Duration;

use ftkv_client::{Error, PermType, Permission};
use ftkv_proto::v1 as pb;
use ftkv_proto::v1::auth_client::AuthClient;
use ftkv_proto::v1::cluster_client::ClusterClient;
use ftkv_proto::v1::kv_client::KvClient;
use ftkv_proto::v1::maintenance_client::MaintenanceClient;
use ftkv_tests::fixture::{serial, Cluster, ClusterOptions};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

const ROOT_PW: &str = "root-secret";
const ALICE_PW: &str = "alice-secret";
const BOB_PW: &str = "bob-secret";

async fn channel(c: &Cluster, id: u64) -> Channel {
    let addr = c.endpoint(id).unwrap();
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap()
}

fn req<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut r = Request::new(message);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

async fn authenticate(c: &Cluster, id: u64, name: &str, password: &str) -> Result<String, Status> {
    AuthClient::new(channel(c, id).await)
        .authenticate(pb::AuthenticateRequest {
            name: name.into(),
            password: password.into(),
        })
        .await
        .map(|r| r.into_inner().token)
}

async fn put(c: &Cluster, id: u64, key: &str, token: Option<&str>) -> Result<(), Status> {
    KvClient::new(channel(c, id).await)
        .put(req(
            pb::PutRequest {
                key: key.into(),
                value: b"v".to_vec(),
                session: None,
            },
            token,
        ))
        .await
        .map(|_| ())
}

async fn get(c: &Cluster, id: u64, key: &str, token: Option<&str>, serializable: bool) -> Result<(), Status> {
    let consistency = if serializable {
        pb::ReadConsistency::Serializable
    } else {
        pb::ReadConsistency::Linearizable
    };
    KvClient::new(channel(c, id).await)
        .get(req(
            pb::GetRequest {
                key: key.into(),
                consistency: consistency as i32,
            },
            token,
        ))
        .await
        .map(|_| ())
}

fn expect_code<T: std::fmt::Debug>(what: &str, result: Result<T, Status>, code: Code) -> Status {
    match result {
        Err(s) if s.code() == code => s,
        other => panic!("{what}: expected {code:?}, got {other:?}"),
    }
}

/// Root (user and role), alice (readwrite on the prefix `a/`), bob (read on every key), auth
/// enabled; enabling it first without root must fail with FAILED_PRECONDITION.
async fn set_up_auth(c: &Cluster) {
    let admin = c.client().await.unwrap();
    let enable = AuthClient::new(channel(c, c.wait_for_leader().await.unwrap()).await)
        .auth_enable(pb::AuthEnableRequest {})
        .await;
    expect_code("auth enable without root", enable, Code::FailedPrecondition);
    admin.user_add("root", ROOT_PW).await.unwrap();
    let enable = AuthClient::new(channel(c, c.wait_for_leader().await.unwrap()).await)
        .auth_enable(pb::AuthEnableRequest {})
        .await;
    let s = expect_code(
        "auth enable with a root user lacking the root role",
        enable,
        Code::FailedPrecondition,
    );
    assert!(s.message().contains("root"), "{}", s.message());
    admin.role_add("root").await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.user_add("alice", ALICE_PW).await.unwrap();
    admin.role_add("a-writer").await.unwrap();
    admin
        .role_grant_permission(
            "a-writer",
            Permission {
                perm_type: PermType::ReadWrite,
                key: b"a/".to_vec(),
                range_end: ftkv_client::prefix_end(b"a/"),
            },
        )
        .await
        .unwrap();
    admin.user_grant_role("alice", "a-writer").await.unwrap();
    admin.user_add("bob", BOB_PW).await.unwrap();
    admin.role_add("reader").await.unwrap();
    admin
        .role_grant_permission(
            "reader",
            Permission {
                perm_type: PermType::Read,
                key: Vec::new(),
                range_end: vec![0],
            },
        )
        .await
        .unwrap();
    admin.user_grant_role("bob", "reader").await.unwrap();
    admin.auth_enable().await.unwrap();
    // The admin client has no user: from now on it is refused.
    match admin.put("x", "y").await {
        Err(Error::Unauthenticated { .. }) => {}
        other => panic!("a client without a user after auth enable: {other:?}"),
    }
}

#[tokio::test]
async fn auth_matrix_on_a_three_node_cluster() {
    let _serial = serial().await;
    let c = Cluster::start(ClusterOptions {
        extra_args: [
            "--snapshot-every-entries",
            "50",
            "--max-in-snapshot-log-to-keep",
            "5",
        ]
        .map(str::to_string)
        .to_vec(),
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    let leader = c.wait_for_leader().await.unwrap();
    // One follower misses everything about auth: it catches up by snapshot later.
    let late = c.ids().into_iter().find(|id| *id != leader).unwrap();
    c.stop(late).await.unwrap();
    set_up_auth(&c).await;
    let leader = c.wait_for_leader().await.unwrap();

    // No token, unknown and forged tokens: UNAUTHENTICATED.
    let s = expect_code(
        "put without a token",
        put(&c, leader, "a/1", None).await,
        Code::Unauthenticated,
    );
    assert!(s.message().contains("no token"), "{}", s.message());
    expect_code(
        "get without a token",
        get(&c, leader, "a/1", None, false).await,
        Code::Unauthenticated,
    );
    expect_code(
        "an unknown token",
        put(&c, leader, "a/1", Some("ftkv1.00.00")).await,
        Code::Unauthenticated,
    );
    let alice = authenticate(&c, leader, "alice", ALICE_PW).await.unwrap();
    let (body, _sig) = alice.rsplit_once('.').unwrap();
    let forged = format!("{body}.{}", "0".repeat(64));
    expect_code(
        "a forged signature",
        put(&c, leader, "a/1", Some(&forged)).await,
        Code::Unauthenticated,
    );
    let mut bad_header = Request::new(pb::GetRequest {
        key: b"a/1".to_vec(),
        consistency: 0,
    });
    bad_header
        .metadata_mut()
        .insert("authorization", alice.parse().unwrap());
    let r = KvClient::new(channel(&c, leader).await).get(bad_header).await;
    expect_code("a token without \"Bearer \"", r, Code::Unauthenticated);

    // Wrong password, unknown user: UNAUTHENTICATED; the client library's typed error.
    expect_code(
        "wrong password",
        authenticate(&c, leader, "alice", "nope").await,
        Code::Unauthenticated,
    );
    expect_code(
        "unknown user",
        authenticate(&c, leader, "mallory", "x").await,
        Code::Unauthenticated,
    );
    match c.client_builder().user("alice", "nope").build().await {
        Err(Error::Unauthenticated { message }) => assert!(message.contains("wrong"), "{message}"),
        other => panic!("client with a wrong password: {other:?}"),
    }

    // alice: readwrite on the prefix a/.
    put(&c, leader, "a/1", Some(&alice)).await.unwrap();
    get(&c, leader, "a/1", Some(&alice), false).await.unwrap();
    let s = expect_code(
        "alice writes outside a/",
        put(&c, leader, "b/1", Some(&alice)).await,
        Code::PermissionDenied,
    );
    assert!(
        s.message().contains("\"alice\"")
            && s.message().contains("WRITE")
            && s.message().contains("key \"b/1\""),
        "{}",
        s.message()
    );
    let scan_all = KvClient::new(channel(&c, leader).await)
        .scan(req(
            pb::ScanRequest {
                start: b"a/".to_vec(),
                ..Default::default()
            },
            Some(&alice),
        ))
        .await;
    let s = expect_code("alice scans past a/", scan_all, Code::PermissionDenied);
    assert!(
        s.message().contains("READ") && s.message().contains("range [\"a/\", end of keys)"),
        "{}",
        s.message()
    );
    let scan_prefix = KvClient::new(channel(&c, leader).await)
        .scan(req(
            pb::ScanRequest {
                start: b"a/".to_vec(),
                end: b"a0".to_vec(),
                ..Default::default()
            },
            Some(&alice),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(scan_prefix.kvs.len(), 1);
    // Through the client library (Kv.Batch items): the same checks, typed errors.
    let alice_client = c.client_builder().user("alice", ALICE_PW).build().await.unwrap();
    alice_client.put("a/2", "v").await.unwrap();
    match alice_client.put("b/2", "v").await {
        Err(Error::PermissionDenied { message }) => assert!(message.contains("b/2"), "{message}"),
        other => panic!("alice puts b/2 through the client: {other:?}"),
    }
    match alice_client.delete_prefix("").await {
        Err(Error::PermissionDenied { message }) => assert!(message.contains("range"), "{message}"),
        other => panic!("alice deletes everything: {other:?}"),
    }

    // bob: read-only. A Txn with a write is refused whole; a read-only Txn runs.
    let bob = authenticate(&c, leader, "bob", BOB_PW).await.unwrap();
    get(&c, leader, "a/1", Some(&bob), false).await.unwrap();
    let txn = |write: bool| pb::TxnRequest {
        compare: vec![pb::Compare {
            key: b"a/1".to_vec(),
            target: pb::compare::Target::Exists as i32,
            result: pb::compare::Result::Equal as i32,
            value: Vec::new(),
        }],
        success: if write {
            vec![pb::TxnOp {
                op: Some(pb::txn_op::Op::Put(pb::PutOp {
                    key: b"a/3".to_vec(),
                    value: b"v".to_vec(),
                })),
            }]
        } else {
            vec![pb::TxnOp {
                op: Some(pb::txn_op::Op::Get(pb::TxnGetOp { key: b"a/1".to_vec() })),
            }]
        },
        ..Default::default()
    };
    let r = KvClient::new(channel(&c, leader).await)
        .txn(req(txn(true), Some(&bob)))
        .await;
    let s = expect_code("bob's txn with a write", r, Code::PermissionDenied);
    assert!(
        s.message().contains("\"bob\"") && s.message().contains("WRITE") && s.message().contains("a/3"),
        "{}",
        s.message()
    );
    let ok = KvClient::new(channel(&c, leader).await)
        .txn(req(txn(false), Some(&bob)))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.succeeded && ok.results[0].found);
    assert!(
        KvClient::new(channel(&c, leader).await)
            .txn(req(txn(true), Some(&alice)))
            .await
            .is_ok(),
        "alice may write a/3"
    );

    // Non-root: membership, auth administration, snapshot save, alarm disarm, auth disable.
    let r = ClusterClient::new(channel(&c, leader).await)
        .remove(req(pb::RemoveRequest { id: late }, Some(&alice)))
        .await;
    let s = expect_code("alice removes a member", r, Code::PermissionDenied);
    assert!(s.message().contains("root"), "{}", s.message());
    let r = AuthClient::new(channel(&c, leader).await)
        .user_add(req(
            pb::UserAddRequest {
                name: "eve".into(),
                password: "x".into(),
            },
            Some(&alice),
        ))
        .await;
    expect_code("alice adds a user", r, Code::PermissionDenied);
    let r = MaintenanceClient::new(channel(&c, leader).await)
        .snapshot(req(pb::SnapshotRequest {}, Some(&alice)))
        .await;
    expect_code("alice saves a snapshot", r.map(|_| ()), Code::PermissionDenied);
    let r = ClusterClient::new(channel(&c, leader).await)
        .alarm_disarm(req(pb::AlarmDisarmRequest {}, Some(&bob)))
        .await;
    expect_code("bob disarms alarms", r, Code::PermissionDenied);
    let r = AuthClient::new(channel(&c, leader).await)
        .auth_disable(req(pb::AuthDisableRequest {}, Some(&alice)))
        .await;
    expect_code("alice disables auth", r, Code::PermissionDenied);
    let r = ClusterClient::new(channel(&c, leader).await)
        .status(req(pb::StatusRequest { with_digest: true }, Some(&alice)))
        .await;
    expect_code("alice asks for the state digest", r, Code::PermissionDenied);
    let r = ClusterClient::new(channel(&c, leader).await)
        .status(req(pb::StatusRequest { with_digest: false }, None))
        .await;
    assert!(r.is_ok(), "status without a digest stays open: {r:?}");
    let r = AuthClient::new(channel(&c, leader).await)
        .user_add(req(
            pb::UserAddRequest {
                name: "eve".into(),
                password: "x".into(),
            },
            None,
        ))
        .await;
    expect_code("user add without a token", r, Code::Unauthenticated);
    // Root may: a snapshot save streams.
    let root = authenticate(&c, leader, "root", ROOT_PW).await.unwrap();
    let mut stream = MaintenanceClient::new(channel(&c, leader).await)
        .snapshot(req(pb::SnapshotRequest {}, Some(&root)))
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().is_some());
    drop(stream);
    // Bounded names: INVALID_ARGUMENT.
    let r = AuthClient::new(channel(&c, leader).await)
        .role_add(req(
            pb::RoleAddRequest {
                name: "r".repeat(129),
            },
            Some(&root),
        ))
        .await;
    expect_code("a 129-byte role name", r, Code::InvalidArgument);

    // ftkvctl: --user with --password-file; a refused write exits 1 with a clear message.
    let pw_file = c.dir().join("alice.pw");
    std::fs::write(&pw_file, format!("{ALICE_PW}\n")).unwrap();
    let pw = pw_file.to_str().unwrap();
    let out = c
        .ctl(&["--user", "alice", "--password-file", pw, "put", "a/ctl", "v"])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let out = c
        .ctl(&["--user", "alice", "--password-file", pw, "put", "b/ctl", "v"])
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        out.stderr.contains("permission denied") && out.stderr.contains("b/ctl"),
        "{}",
        out.stderr
    );
    // Bulk load (Kv.BulkLoad): every row's key needs WRITE; a refused load applies nothing.
    let csv = c.dir().join("rows.csv");
    std::fs::write(&csv, "1,x\n2,y\n").unwrap();
    let csv = csv.to_str().unwrap();
    let load = |prefix: &'static str| {
        [
            "--user",
            "alice",
            "--password-file",
            pw,
            "load",
            csv,
            "--columns",
            "id:int,name:str",
            "--key-columns",
            "id",
            "--prefix",
            prefix,
        ]
    };
    let out = c.ctl(&load("a/load/")).await.unwrap();
    assert!(out.success(), "{}", out.stderr);
    let out = c.ctl(&load("b/load/")).await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        out.stderr.contains("permission denied") && out.stderr.contains("b/load/"),
        "{}",
        out.stderr
    );
    let root_scan = c.client_builder().user("root", ROOT_PW).build().await.unwrap();
    assert_eq!(
        root_scan
            .scan_prefix("b/load/", 0, Default::default())
            .await
            .unwrap()
            .len(),
        0
    );
    assert_eq!(
        root_scan
            .scan_prefix("a/load/", 0, Default::default())
            .await
            .unwrap()
            .len(),
        2
    );
    let out = c.ctl(&["put", "a/ctl", "v"]).await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("unauthenticated"), "{}", out.stderr);

    // A token of the leader is valid on every other node (serializable reads served locally).
    for id in c.ids().into_iter().filter(|id| *id != late) {
        get(&c, id, "a/1", Some(&alice), true).await.unwrap();
    }

    // The late follower catches up by snapshot (the leader purged the log behind it: a
    // snapshot every 50 entries, 5 kept) and knows the users, roles, the flag and the key.
    for i in 0..150 {
        alice_client.put(format!("a/fill/{i:03}"), "v").await.unwrap();
    }
    c.restart(late).unwrap();
    c.wait_all_caught_up().await.unwrap();
    let log = c.node_log(late).to_ascii_lowercase();
    assert!(
        [
            "installsnapshot",
            "install_snapshot",
            "receive_snapshot",
            "receiving_snapshot"
        ]
        .iter()
        .any(|m| log.contains(m)),
        "node {late} should have caught up by snapshot"
    );
    get(&c, late, "a/1", Some(&alice), true).await.unwrap();
    expect_code(
        "no token on the node that caught up by snapshot",
        get(&c, late, "a/1", None, true).await,
        Code::Unauthenticated,
    );
    expect_code(
        "alice outside a/ on the node that caught up",
        get(&c, late, "b/1", Some(&alice), true).await,
        Code::PermissionDenied,
    );

    // Leader killed: the new leader accepts the old token.
    let old_leader = c.wait_for_leader().await.unwrap();
    c.kill(old_leader).unwrap();
    let new_leader = loop {
        let l = c.wait_for_leader().await.unwrap();
        if l != old_leader {
            break l;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    put(&c, new_leader, "a/after-kill", Some(&alice)).await.unwrap();
    c.restart(old_leader).unwrap();
    c.wait_all_caught_up().await.unwrap();

    // Full restart: the auth state and the signing key survive.
    for id in c.ids() {
        c.stop(id).await.unwrap();
    }
    for id in c.ids() {
        c.restart(id).unwrap();
    }
    let leader = c.wait_for_leader().await.unwrap();
    let status = AuthClient::new(channel(&c, leader).await)
        .auth_status(pb::AuthStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(status.enabled);
    put(&c, leader, "a/after-restart", Some(&alice)).await.unwrap();
    expect_code(
        "no token after a restart",
        put(&c, leader, "a/1", None).await,
        Code::Unauthenticated,
    );
    expect_code(
        "alice outside a/ after a restart",
        put(&c, leader, "b/1", Some(&alice)).await,
        Code::PermissionDenied,
    );

    // A password change revokes the old token; the client that had it re-authenticates only
    // with the new password.
    let root_client = c.client_builder().user("root", ROOT_PW).build().await.unwrap();
    root_client.user_change_password("alice", "new-pw").await.unwrap();
    let s = expect_code(
        "the token from before the password change",
        put(&c, leader, "a/1", Some(&alice)).await,
        Code::Unauthenticated,
    );
    assert!(s.message().contains("revoked"), "{}", s.message());
    match alice_client.put("a/4", "v").await {
        Err(Error::Unauthenticated { .. }) => {}
        other => panic!("a client with the old password after the change: {other:?}"),
    }
    let renewed = c.client_builder().user("alice", "new-pw").build().await.unwrap();
    renewed.put("a/4", "v").await.unwrap();
    // Deleting the user revokes it too.
    let alice2 = authenticate(&c, leader, "alice", "new-pw").await.unwrap();
    root_client.user_delete("alice").await.unwrap();
    expect_code(
        "the token of a deleted user",
        put(&c, leader, "a/1", Some(&alice2)).await,
        Code::Unauthenticated,
    );
    // Root cannot be deleted while auth is on; auth disable (root) opens everything again.
    match root_client.user_delete("root").await {
        Err(Error::Server { code, .. }) => assert_eq!(code, "FailedPrecondition"),
        other => panic!("deleting root with auth on: {other:?}"),
    }
    root_client.auth_disable().await.unwrap();
    put(&c, leader, "b/open", None).await.unwrap();
    c.check_no_panics().unwrap();
}

#[tokio::test]
async fn expired_tokens_are_refused_and_the_client_renews_them() {
    let _serial = serial().await;
    let c = Cluster::start(ClusterOptions {
        extra_args: ["--auth-token-ttl-ms", "1000"].map(str::to_string).to_vec(),
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    let admin = c.client().await.unwrap();
    admin.user_add("root", ROOT_PW).await.unwrap();
    admin.role_add("root").await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();
    let leader = c.wait_for_leader().await.unwrap();
    let token = authenticate(&c, leader, "root", ROOT_PW).await.unwrap();
    put(&c, leader, "k", Some(&token)).await.unwrap();
    let root_client = c.client_builder().user("root", ROOT_PW).build().await.unwrap();
    root_client.put("k", "1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let s = expect_code(
        "an expired token",
        put(&c, leader, "k", Some(&token)).await,
        Code::Unauthenticated,
    );
    assert!(s.message().contains("expired"), "{}", s.message());
    // The client renews its token (before the call, or after an UNAUTHENTICATED answer).
    root_client.put("k", "2").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(root_client.get("k").await.unwrap(), Some(b"2".to_vec()));
    c.check_no_panics().unwrap();
}

/// A CA issuing leaf certificates (CN and SANs `cn`, localhost, 127.0.0.1).
struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Ca {
    fn new() -> Ca {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "auth test CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    fn issue(&self, cn: &str) -> (String, String) {
        let mut params =
            rcgen::CertificateParams::new(vec![cn.to_string(), "localhost".into(), "127.0.0.1".into()])
                .unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

#[tokio::test]
async fn a_client_certificate_cn_is_the_user_when_no_token_is_sent() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let write = |name: &str, pem: &str| std::fs::write(dir.path().join(name), pem).unwrap();
    write("ca.pem", &ca.cert.pem());
    for id in 1..=3 {
        let (cert, key) = ca.issue(&format!("ftkv-node-{id}"));
        write(&format!("node-{id}.pem"), &cert);
        write(&format!("node-{id}-key.pem"), &key);
    }
    let p = |n: &str| dir.path().join(n).display().to_string();
    let env = vec![
        ("FTKV_CERT_FILE".to_string(), p("node-{id}.pem")),
        ("FTKV_KEY_FILE".to_string(), p("node-{id}-key.pem")),
        ("FTKV_TRUSTED_CA_FILE".to_string(), p("ca.pem")),
        ("FTKV_CLIENT_CERT_AUTH".to_string(), "true".to_string()),
    ];
    let tls_as = |cn: &str| ftkv_tests::fixture::FixtureTls {
        ca_pem: ca.cert.pem(),
        identity: Some(ca.issue(cn)),
    };
    let c = Cluster::start(ClusterOptions {
        env,
        client_tls: Some(tls_as("fixture")),
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    let client_as = |cn: &str| {
        c.client_builder()
            .tls(tls_as(cn).client_options())
            .retry(ftkv_client::RetryPolicy {
                deadline: Duration::from_secs(10),
                ..Default::default()
            })
    };
    let root = client_as("root").build().await.unwrap();
    root.user_add("root", ROOT_PW).await.unwrap();
    root.role_add("root").await.unwrap();
    root.user_grant_role("root", "root").await.unwrap();
    root.user_add("alice", ALICE_PW).await.unwrap();
    root.role_add("a-writer").await.unwrap();
    root.role_grant_permission(
        "a-writer",
        Permission {
            perm_type: PermType::ReadWrite,
            key: b"a/".to_vec(),
            range_end: b"a0".to_vec(),
        },
    )
    .await
    .unwrap();
    root.user_grant_role("alice", "a-writer").await.unwrap();
    root.auth_enable().await.unwrap();

    // No token: the certificate's CN is the user (Kv.Batch items and unary calls alike).
    let alice = client_as("alice").build().await.unwrap();
    alice.put("a/1", "v").await.unwrap();
    match alice.put("b/1", "v").await {
        Err(Error::PermissionDenied { message }) => {
            assert!(
                message.contains("\"alice\"") && message.contains("b/1"),
                "{message}"
            )
        }
        other => panic!("alice's certificate writing b/1: {other:?}"),
    }
    match alice.user_list().await {
        Err(Error::PermissionDenied { message }) => assert!(message.contains("root"), "{message}"),
        other => panic!("alice's certificate listing users: {other:?}"),
    }
    assert_eq!(
        root.user_list().await.unwrap(),
        vec!["alice".to_string(), "root".to_string()]
    );
    // A CN that is no user, and no token: UNAUTHENTICATED.
    let stranger = client_as("stranger").build().await.unwrap();
    match stranger.get("a/1").await {
        Err(Error::Unauthenticated { message }) => assert!(message.contains("stranger"), "{message}"),
        other => panic!("a certificate naming no user: {other:?}"),
    }
    // A token wins over the certificate: root's certificate with alice's token is alice.
    let root_cert_alice_user = client_as("root").user("alice", ALICE_PW).build().await.unwrap();
    match root_cert_alice_user.put("b/2", "v").await {
        Err(Error::PermissionDenied { message }) => assert!(message.contains("\"alice\""), "{message}"),
        other => panic!("the token's user is the caller: {other:?}"),
    }
    c.check_no_panics().unwrap();
}
