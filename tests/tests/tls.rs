//! Issue 17 (transport half): TLS and mTLS on every port, authenticated peers, reload.
//!
//! Every case asserts the exact error: a plaintext client at a TLS port (`FAILED_PRECONDITION`
//! with reason `TLS_REQUIRED`, `Error::Tls` in the client), a client certificate of another CA
//! and no client certificate under client-cert auth (`Error::Tls`, the handshake refused), a
//! fake peer (another CA's certificate, none, or a member's certificate claiming another id)
//! sending Vote with a huge term and AppendEntries (refused; term, leader and data unchanged),
//! certificate reload under load, and bad TLS configurations refused at start.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ftkv_client::Error;
use ftkv_proto::raft::v1::raft_client::RaftClient;
use ftkv_proto::raft::v1::RaftMessage;
use ftkv_tests::fixture::{serial, Binaries, Cluster, ClusterOptions, FixtureTls};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

/// A CA that issues leaf certificates.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }

    /// (cert PEM, key PEM) with CN `cn` and SANs `cn`, localhost, 127.0.0.1.
    fn issue(&self, cn: &str) -> (String, String) {
        let mut params =
            CertificateParams::new(vec![cn.to_string(), "localhost".into(), "127.0.0.1".into()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Certificates of a TLS cluster in a temp dir: `ca.pem`, `node-<id>.pem`/`-key.pem`,
/// `client.pem`/`-key.pem`.
struct Pki {
    dir: tempfile::TempDir,
    ca: Ca,
    client: (String, String),
}

impl Pki {
    fn new(nodes: u64) -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("cluster CA");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        for id in 1..=nodes {
            let (cert, key) = ca.issue(&format!("ftkv-node-{id}"));
            std::fs::write(dir.path().join(format!("node-{id}.pem")), cert).unwrap();
            std::fs::write(dir.path().join(format!("node-{id}-key.pem")), key).unwrap();
        }
        let client = ca.issue("client");
        std::fs::write(dir.path().join("client.pem"), &client.0).unwrap();
        std::fs::write(dir.path().join("client-key.pem"), &client.1).unwrap();
        Pki { dir, ca, client }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Node environment: every port on TLS, client-cert auth, peer TLS.
    fn env(&self) -> Vec<(String, String)> {
        let p = |n: &str| self.path(n).display().to_string();
        vec![
            ("FTKV_CERT_FILE".into(), p("node-{id}.pem")),
            ("FTKV_KEY_FILE".into(), p("node-{id}-key.pem")),
            ("FTKV_TRUSTED_CA_FILE".into(), p("ca.pem")),
            ("FTKV_CLIENT_CERT_AUTH".into(), "true".into()),
            ("FTKV_PEER_CERT_FILE".into(), p("node-{id}.pem")),
            ("FTKV_PEER_KEY_FILE".into(), p("node-{id}-key.pem")),
            ("FTKV_PEER_TRUSTED_CA_FILE".into(), p("ca.pem")),
            ("FTKV_TLS_RELOAD_INTERVAL_MS".into(), "200".into()),
        ]
    }

    fn fixture_tls(&self) -> FixtureTls {
        FixtureTls {
            ca_pem: self.ca.pem(),
            identity: Some(self.client.clone()),
        }
    }

    async fn cluster(&self) -> Cluster {
        Cluster::start(ClusterOptions {
            env: self.env(),
            client_tls: Some(self.fixture_tls()),
            ..Default::default()
        })
        .await
        .expect("TLS cluster starts")
    }
}

fn expect_tls_error<T: std::fmt::Debug>(result: Result<T, Error>, needle: &str, what: &str) -> String {
    match result {
        Err(Error::Tls { message }) => {
            assert!(message.contains(needle), "{what}: {message}");
            message
        }
        other => panic!("{what}: expected Error::Tls containing {needle:?}, got {other:?}"),
    }
}

async fn client_with(endpoints: Vec<String>, tls: Option<ftkv_client::TlsOptions>) -> ftkv_client::Client {
    let mut builder = ftkv_client::Client::builder()
        .endpoints(endpoints)
        .request_timeout(Duration::from_secs(3))
        .retry(ftkv_client::RetryPolicy {
            deadline: Duration::from_secs(5),
            ..Default::default()
        });
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    builder.build().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_ports_refuse_plaintext_foreign_and_anonymous_clients() {
    let _serial = serial().await;
    let pki = Pki::new(3);
    let cluster = pki.cluster().await;
    let good = cluster.client().await.unwrap();
    good.put("k", "v")
        .await
        .expect("a client with the CA and a client certificate is served");

    // Plaintext client at the TLS client port: the node says TLS is required.
    let plain = client_with(cluster.endpoints(), None).await;
    expect_tls_error(plain.get("k").await, "requires TLS", "plaintext client");
    let mut raw =
        ftkv_proto::v1::kv_client::KvClient::connect(format!("http://{}", cluster.endpoint(1).unwrap()))
            .await
            .unwrap();
    let status = raw
        .get(ftkv_proto::v1::GetRequest {
            key: b"k".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    let info = ftkv_proto::status_details::decode(status.details()).expect("ErrorInfo");
    assert_eq!(info.reason, ftkv_proto::status_details::REASON_TLS_REQUIRED);

    // Plaintext HTTP at the TLS status port: 400 naming TLS.
    let status_addr = cluster.node(1).unwrap().status_addr;
    let mut s = tokio::net::TcpStream::connect(&status_addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut s, b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_string(&mut s, &mut answer),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("requires TLS"), "{answer}");

    // A client certificate from another CA: the handshake is refused.
    let other = Ca::new("other CA");
    let (cert, key) = other.issue("intruder");
    let foreign = client_with(
        cluster.endpoints(),
        Some(ftkv_client::TlsOptions::with_ca_pem(pki.ca.pem()).identity_pem(cert, key)),
    )
    .await;
    expect_tls_error(
        foreign.get("k").await,
        "refused the TLS handshake",
        "foreign client certificate",
    );

    // No client certificate while client-cert auth is on.
    let anonymous = client_with(
        cluster.endpoints(),
        Some(ftkv_client::TlsOptions::with_ca_pem(pki.ca.pem())),
    )
    .await;
    expect_tls_error(
        anonymous.get("k").await,
        "refused the TLS handshake",
        "no client certificate",
    );

    // A server certificate the client's CA did not sign.
    let wrong_ca = client_with(
        cluster.endpoints(),
        Some(
            ftkv_client::TlsOptions::with_ca_pem(other.pem())
                .identity_pem(pki.client.0.clone(), pki.client.1.clone()),
        ),
    )
    .await;
    expect_tls_error(
        wrong_ca.get("k").await,
        "server's certificate was refused",
        "unknown server CA",
    );

    // ftkvctl: the same through its flags, with a clear line and a non-zero exit.
    let ctl = |args: Vec<String>| async move {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        ftkv_tests::fixture::run_ftkvctl(&refs, None, Duration::from_secs(60))
            .await
            .unwrap()
    };
    let endpoints = cluster.endpoints().join(",");
    let ok = ctl(vec![
        "--endpoints".into(),
        endpoints.clone(),
        "--cacert".into(),
        pki.path("ca.pem").display().to_string(),
        "--cert".into(),
        pki.path("client.pem").display().to_string(),
        "--key".into(),
        pki.path("client-key.pem").display().to_string(),
        "get".into(),
        "k".into(),
    ])
    .await;
    assert!(ok.success(), "{} {}", ok.stdout, ok.stderr);
    assert!(ok.stdout.contains('v'), "{}", ok.stdout);
    let plain = ctl(vec!["--endpoints".into(), endpoints, "get".into(), "k".into()]).await;
    assert!(!plain.success());
    assert!(plain.stderr.contains("requires TLS"), "{}", plain.stderr);

    // Nothing of this reached the data.
    assert_eq!(good.get("k").await.unwrap().as_deref(), Some(&b"v"[..]));
    cluster.check_no_panics().unwrap();
}

/// The raw peer client of a fake peer presenting `identity` (or none), trusting the cluster CA.
async fn fake_peer(
    addr: &str,
    ca_pem: &str,
    identity: Option<(String, String)>,
) -> Result<RaftClient<tonic::transport::Channel>, String> {
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca_pem));
    if let Some((cert, key)) = identity {
        tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(RaftClient::new(channel))
}

/// A Vote from `candidate` with a huge term, as openraft encodes it.
fn huge_vote(candidate: u64) -> RaftMessage {
    let term = 1u64 << 40;
    let req = openraft::raft::VoteRequest::<u64>::new(
        openraft::Vote::new(term, candidate),
        Some(openraft::LogId::new(
            openraft::CommittedLeaderId::new(term, candidate),
            1 << 30,
        )),
    );
    RaftMessage {
        payload: postcard::to_stdvec(&req).unwrap(),
        from: candidate,
        is_error: false,
        cluster_id: 0,
    }
}

/// An empty AppendEntries (a heartbeat) from `leader` at a huge term, in openraft's field order.
fn huge_append(leader: u64) -> RaftMessage {
    #[derive(serde::Serialize)]
    struct AppendEntries {
        vote: openraft::Vote<u64>,
        prev_log_id: Option<openraft::LogId<u64>>,
        entries: Vec<()>,
        leader_commit: Option<openraft::LogId<u64>>,
    }
    let mut vote = openraft::Vote::new(1 << 40, leader);
    vote.commit();
    let req = AppendEntries {
        vote,
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    RaftMessage {
        payload: postcard::to_stdvec(&req).unwrap(),
        from: leader,
        is_error: false,
        cluster_id: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_peers_are_refused_and_change_nothing() {
    let _serial = serial().await;
    let pki = Pki::new(3);
    let cluster = pki.cluster().await;
    let client = cluster.client().await.unwrap();
    client.put("before", "1").await.unwrap();
    let leader = cluster.wait_for_leader().await.unwrap();
    let term = cluster.status(leader).await.unwrap().term;
    let target = if leader == 1 { 2 } else { 1 };
    let peer_addr = cluster.node(target).unwrap().peer_addr;

    // Another CA's certificate, and no certificate: no handshake, no RPC.
    let other = Ca::new("forger CA");
    let forged = other.issue(&format!("ftkv-node-{leader}"));
    for (what, identity, alert) in [
        ("another CA's certificate", Some(forged), "UnknownCA"),
        // TLS 1.3: the server's `certificate_required` alert, when the client reads it in time.
        ("no certificate", None, "CertificateRequired"),
    ] {
        let refused = match fake_peer(&peer_addr, &pki.ca.pem(), identity).await {
            Err(e) => e,
            Ok(mut peer) => {
                let vote = peer.vote(huge_vote(3)).await;
                let append = peer.append_entries(huge_append(leader)).await;
                assert!(
                    vote.is_err() && append.is_err(),
                    "{what}: accepted: {vote:?} {append:?}"
                );
                let status = vote.unwrap_err();
                assert_ne!(
                    status.code(),
                    tonic::Code::PermissionDenied,
                    "{what}: reached the service: {status:?}"
                );
                format!("{status:?}")
            }
        };
        // rustls sends the alert, but the connection may close (or the client's write meet a
        // broken pipe / reset) before the client reads it: any of these is a refused handshake.
        assert!(
            [alert, "connection closed", "broken pipe", "onnection reset"]
                .iter()
                .any(|sign| refused.contains(sign)),
            "{what}: {refused}"
        );
    }

    // A member's real certificate claiming to be another member: PERMISSION_DENIED.
    let (cert, key) = (
        std::fs::read_to_string(pki.path(&format!("node-{target}.pem"))).unwrap(),
        std::fs::read_to_string(pki.path(&format!("node-{target}-key.pem"))).unwrap(),
    );
    let impostor = 6 - leader - target; // the third node's id
    let other_addr = cluster.node(leader).unwrap().peer_addr;
    let mut peer = fake_peer(&other_addr, &pki.ca.pem(), Some((cert, key)))
        .await
        .unwrap();
    let vote = peer.vote(huge_vote(impostor)).await.unwrap_err();
    assert_eq!(vote.code(), tonic::Code::PermissionDenied, "{vote:?}");
    assert!(
        vote.message().contains(&format!("ftkv-node-{target}")),
        "{vote:?}"
    );
    let append = peer.append_entries(huge_append(impostor)).await.unwrap_err();
    assert_eq!(append.code(), tonic::Code::PermissionDenied, "{append:?}");

    // Term, leader and data unchanged.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cluster.wait_for_leader().await.unwrap(), leader);
    for id in cluster.ids() {
        let st = cluster.status(id).await.unwrap();
        assert_eq!(st.term, term, "node {id}'s term moved");
        assert_eq!(st.leader_id, leader, "node {id}'s leader moved");
    }
    assert_eq!(client.get("before").await.unwrap().as_deref(), Some(&b"1"[..]));
    client.put("after", "2").await.unwrap();
    cluster.check_no_panics().unwrap();
}

/// The DER of the certificate the TLS port at `addr` serves now (a fresh connection).
async fn served_cert(addr: &str, ca_pem: &str, client: &(String, String)) -> Vec<u8> {
    use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let certs: Vec<_> = CertificateDer::pem_slice_iter(client.0.as_bytes())
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_slice(client.1.as_bytes()).unwrap();
    let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(certs, key)
    .unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].as_ref().to_vec()
}

fn der_of(pem: &str) -> Vec<u8> {
    use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateDer};
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .as_ref()
        .to_vec()
}

/// Writes `text` to `path` through a rename (a new inode, as `kubectl` and cert-manager do).
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn wait_for_cert(addr: &str, pki: &Pki, want: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if served_cert(addr, &pki.ca.pem(), &pki.client).await == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the port at {addr} never served the new certificate"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_reload_without_a_restart_and_broken_files_are_rejected() {
    let _serial = serial().await;
    let pki = Pki::new(3);
    let cluster = pki.cluster().await;
    let addr = cluster.endpoint(1).unwrap();
    let original = der_of(&std::fs::read_to_string(pki.path("node-1.pem")).unwrap());
    assert_eq!(served_cert(&addr, &pki.ca.pem(), &pki.client).await, original);

    // Clients keep writing through the whole rotation.
    let client = cluster.client().await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, written, client) = (stop.clone(), written.clone(), client.clone());
        tokio::spawn(async move {
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let i = written.load(Ordering::Relaxed);
                match client.put(format!("rot/{i:06}"), "v").await {
                    Ok(_) => {
                        written.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => errors.push(e),
                }
            }
            errors
        })
    };

    // A new certificate (same CA, same node name) and key, swapped in while the node runs.
    let (cert, key) = pki.ca.issue("ftkv-node-1");
    replace(&pki.path("node-1-key.pem"), &key);
    replace(&pki.path("node-1.pem"), &cert);
    let rotated = der_of(&cert);
    assert_ne!(rotated, original);
    wait_for_cert(&addr, &pki, &rotated).await;

    // A broken replacement: rejected, logged, the rotated certificate stays.
    replace(
        &pki.path("node-1.pem"),
        "-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n",
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster.node_log(1).contains("TLS reload rejected") {
        assert!(
            Instant::now() < deadline,
            "no rejection logged:\n{}",
            cluster.log_tail(1, 30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(served_cert(&addr, &pki.ca.pem(), &pki.client).await, rotated);
    // SIGHUP forces a reload: still rejected, still serving, still alive.
    let pid = cluster.pid(1).unwrap();
    assert!(send_signal(pid, "HUP"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(cluster.is_running(1));
    assert_eq!(served_cert(&addr, &pki.ca.pem(), &pki.client).await, rotated);

    let before = written.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let errors = writer.await.unwrap();
    assert!(errors.is_empty(), "running clients saw errors: {errors:?}");
    assert!(
        written.load(Ordering::Relaxed) > before,
        "writes stopped during the rotation"
    );
    // A brand-new client connects with the rotated certificate.
    let fresh = cluster.client().await.unwrap();
    for id in cluster.ids() {
        let st = fresh.status_with(&cluster.endpoint(id).unwrap(), false).await;
        assert!(st.is_ok(), "node {id}: {st:?}");
    }
    match fresh.get("rot/000000").await {
        Ok(v) => assert_eq!(v.as_deref(), Some(&b"v"[..])),
        Err(e) => panic!(
            "fresh client: {e:?}\n{}",
            cluster
                .node_log(1)
                .lines()
                .filter(|l| !l.contains("openraft") && (l.contains("WARN") || l.contains("ERROR")))
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
    cluster.check_no_panics().unwrap();
}

/// `kill -SIG pid` through the utility (no unsafe code in tests).
fn send_signal(pid: u32, signal: &str) -> bool {
    std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_configurations_are_refused_at_start_and_sighup_does_not_kill_a_plaintext_node() {
    let _serial = serial().await;
    let pki = Pki::new(2);
    let node = Binaries::try_locate().unwrap().node;
    let data = tempfile::tempdir().unwrap();
    let p = |n: &str| pki.path(n).display().to_string();
    let check = |args: Vec<String>| {
        let out = std::process::Command::new(&node)
            .arg("check-config")
            .arg(format!("--data-dir={}", data.path().display()))
            .args(&args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, err) = check(vec![
        format!("--cert-file={}", p("node-1.pem")),
        format!("--key-file={}", p("node-1-key.pem")),
    ]);
    assert!(ok, "{err}");
    for (args, needle) in [
        (
            vec![
                format!("--cert-file={}", p("missing.pem")),
                format!("--key-file={}", p("node-1-key.pem")),
            ],
            "cannot read",
        ),
        (
            vec![
                format!("--cert-file={}", p("node-1.pem")),
                format!("--key-file={}", p("node-2-key.pem")),
            ],
            "does not match",
        ),
        (
            vec![
                format!("--cert-file={}", p("node-1.pem")),
                format!("--key-file={}", p("node-1-key.pem")),
                "--client-cert-auth".into(),
            ],
            "--trusted-ca-file",
        ),
        (
            vec![format!("--peer-cert-file={}", p("node-1.pem"))],
            "--peer-trusted-ca-file",
        ),
    ] {
        let (ok, err) = check(args.clone());
        assert!(!ok, "{args:?} was accepted");
        assert!(err.contains(needle), "{args:?}: {err}");
    }

    let cluster = Cluster::start(ClusterOptions {
        nodes: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(send_signal(cluster.pid(1).unwrap(), "HUP"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(cluster.is_running(1), "SIGHUP killed a node without TLS");
    cluster.client().await.unwrap().put("k", "v").await.unwrap();
}
