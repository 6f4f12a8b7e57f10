//! Issue 16 (operations): what monitoring and orchestration see of real `ftkv-node` processes.
//! `/metrics` after writes (etcd's names, counters moving, histograms filled), `/readyz` and the
//! gRPC health turning unready on a leader cut off from its followers and back, `/livez`
//! staying up meanwhile, reflection listing the services, systemd's READY=1 / STOPPING=1, and
//! `check-config --id-from-hostname` as a StatefulSet pod runs it.
//!
//! Needs the binaries: `cargo build --workspace --bins`, then `cargo test -p ftkv-tests`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ftkv_proto::v1::PutRequest;
use ftkv_tests::fixture::{serial, Binaries, Cluster, ClusterOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` on a status port: (HTTP status code, body).
async fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = tokio::time::timeout(Duration::from_secs(10), tokio::net::TcpStream::connect(addr))
        .await
        .expect("connect timeout")
        .expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_string(&mut out))
        .await
        .expect("read timeout")
        .unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// Samples of a Prometheus text page: `name{labels}` (labels as rendered) -> value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Sum of the samples of `name` whose labels contain every `label="value"` of `labels`.
fn sum(samples: &BTreeMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            let (n, rest) = series.split_once('{').unwrap_or((series.as_str(), ""));
            n == name && labels.iter().all(|l| rest.contains(l))
        })
        .map(|(_, v)| v)
        .sum()
}

async fn metrics(addr: &str) -> BTreeMap<String, f64> {
    let (code, body) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    samples(&body)
}

/// Polls `/readyz` of `addr` until `want(code, body)`, for at most 60 s.
async fn wait_readyz(addr: &str, what: &str, want: impl Fn(u16, &str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, body) = http_get(addr, "/readyz").await;
        if want(code, &body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: /readyz of {addr} still {code}:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn health_client(
    addr: &str,
) -> tonic_health::pb::health_client::HealthClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    tonic_health::pb::health_client::HealthClient::new(channel)
}

async fn health(addr: &str, service: &str) -> i32 {
    let mut client = health_client(addr).await;
    client
        .check(tonic_health::pb::HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

/// Polls the gRPC health of `service` on `addr` until it is `want`, for at most 60 s.
async fn wait_health(
    addr: &str,
    service: &str,
    want: tonic_health::pb::health_check_response::ServingStatus,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = health(addr, service).await;
        if status == want as i32 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "gRPC health of {service:?} on {addr} is {status}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_etcd_names_and_move_with_writes() {
    let _serial = serial().await;
    // JSON log lines on every node (checked at the end).
    let cluster = Cluster::start(ClusterOptions {
        // Checkpoints every 10 entries, so node blocks are written (the compression ratio).
        extra_args: vec![
            "--log-format".into(),
            "json".into(),
            "--snapshot-every-entries".into(),
            "10".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let leader = cluster.wait_for_leader().await.unwrap();
    let follower = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
    let leader_status = cluster.node(leader).unwrap().status_addr;
    let before = metrics(&leader_status).await;

    // Unary puts straight to the leader (the client library would multiplex them over one
    // Kv.Batch stream, which is counted when it ends).
    let mut raw = cluster.kv_raw(leader).await.unwrap();
    for i in 0..20 {
        raw.put(PutRequest {
            key: format!("m/{i}").into_bytes(),
            value: vec![b'v'; 100],
            session: None,
        })
        .await
        .unwrap();
    }
    // A follower refuses a put: counted with its non-OK code.
    let mut raw_follower = cluster.kv_raw(follower).await.unwrap();
    let refused = raw_follower
        .put(PutRequest {
            key: b"m/refused".to_vec(),
            value: b"v".to_vec(),
            session: None,
        })
        .await
        .unwrap_err();

    let after = metrics(&leader_status).await;
    let put = ["grpc_service=\"ftkv.v1.Kv\"", "grpc_method=\"Put\""];
    let ok = [put[0], put[1], "grpc_code=\"OK\""];
    assert_eq!(
        sum(&after, "grpc_server_handled_total", &ok) - sum(&before, "grpc_server_handled_total", &ok),
        20.0
    );
    assert!(sum(&after, "grpc_server_started_total", &put) >= 20.0);
    assert!(sum(&after, "grpc_server_handling_seconds_count", &put) >= 20.0);
    assert!(
        sum(
            &after,
            "grpc_server_handling_seconds_bucket",
            &[put[0], put[1], "le=\"+Inf\""]
        ) >= 20.0
    );

    let delta = |name: &str| sum(&after, name, &[]) - sum(&before, name, &[]);
    assert!(
        delta("ftkv_server_proposals_committed_total") >= 20.0,
        "committed moved by {}",
        delta("ftkv_server_proposals_committed_total")
    );
    assert!(delta("ftkv_server_proposals_applied_total") >= 20.0);
    assert!(delta("ftkv_disk_wal_fsync_duration_seconds_count") >= 1.0);
    assert!(delta("ftkv_disk_wal_write_bytes_total") >= 20.0 * 100.0);
    assert!(delta("ftkv_engine_logical_bytes_written_total") >= 20.0 * 100.0);
    assert_eq!(sum(&after, "ftkv_server_has_leader", &[]), 1.0);
    assert_eq!(sum(&after, "ftkv_server_is_leader", &[]), 1.0);
    assert!(sum(&after, "ftkv_server_leader_changes_seen_total", &[]) >= 1.0);
    assert_eq!(sum(&after, "ftkv_server_proposals_pending", &[]), 0.0);
    assert!(
        sum(
            &after,
            "ftkv_network_peer_round_trip_time_seconds_count",
            &[&format!("To=\"{follower}\"")]
        ) >= 1.0
    );
    assert!(sum(&after, "ftkv_mvcc_db_total_size_in_bytes", &[]) > 0.0);
    assert!(sum(&after, "ftkv_disk_wal_total_size_in_bytes", &[]) > 0.0);
    assert!(sum(&after, "ftkv_disk_data_dir_capacity_bytes", &[]) > 0.0);
    assert!(sum(&after, "ftkv_engine_cache_capacity_bytes", &[]) > 0.0);
    assert!(sum(&after, "ftkv_build_info", &["version=\"", "engine=\"fractal\""]) == 1.0);
    // Histograms are histograms (buckets for histogram_quantile), in seconds.
    assert!(after
        .keys()
        .any(|k| k.starts_with("ftkv_disk_wal_fsync_duration_seconds_bucket{le=\"0.001\"")));

    let f = metrics(&cluster.node(follower).unwrap().status_addr).await;
    assert_eq!(sum(&f, "ftkv_server_has_leader", &[]), 1.0);
    assert_eq!(sum(&f, "ftkv_server_is_leader", &[]), 0.0);
    let refused_code = refused.code();
    assert_ne!(refused_code, tonic::Code::Ok);
    assert!(
        sum(&f, "grpc_server_handled_total", &[put[0], put[1]]) - sum(&f, "grpc_server_handled_total", &ok)
            >= 1.0,
        "the refused put ({refused_code:?}) is not counted on the follower"
    );

    // The engine's compression ratio appears once a checkpoint wrote node blocks.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ratio = sum(
            &metrics(&leader_status).await,
            "ftkv_engine_compression_ratio",
            &[],
        );
        if ratio > 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no ftkv_engine_compression_ratio above 1 after checkpoints (last {ratio})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // `--log-format json`: every log line is one JSON object naming its node (lines of the
    // binary's own `ftkv-node:` messages printed before logging starts, and the fixture's
    // `=====` banners between starts, excepted).
    for id in cluster.ids() {
        let log = cluster.node_log(id);
        let mut objects = 0;
        for line in log
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("ftkv-node:") && !l.starts_with("====="))
        {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("node {id}: not JSON ({e}): {line}"));
            assert_eq!(v["node_id"], id, "node {id}: {line}");
            assert!(
                v["level"].is_string() && v["message"].is_string(),
                "node {id}: {line}"
            );
            objects += 1;
        }
        assert!(objects > 0, "node {id} logged nothing");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_and_health_fail_on_a_leader_cut_off_from_its_followers() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let leader = cluster.wait_for_leader().await.unwrap();
    let addr = cluster.node(leader).unwrap();
    for id in cluster.ids() {
        let status = cluster.node(id).unwrap().status_addr;
        let body = wait_readyz(&status, "ready at start", |code, _| code == 200).await;
        for check in [
            "leader",
            "applied",
            "linearizable_read",
            "non_learner",
            "alarm",
            "draining",
        ] {
            assert!(body.contains(&format!("[+]{check} ok")), "{body}");
        }
    }
    wait_health(&addr.client_addr, "", ServingStatus::Serving).await;
    wait_health(&addr.client_addr, "ftkv.v1.Kv", ServingStatus::Serving).await;

    // Cut the leader off: its followers stop answering. openraft keeps it leader, so only the
    // linearizable read check (a ReadIndex round needs a quorum) can tell.
    let followers: Vec<u64> = cluster.ids().into_iter().filter(|&id| id != leader).collect();
    for &id in &followers {
        cluster.pause(id).unwrap();
    }
    let body = wait_readyz(&addr.status_addr, "cut off", |code, body| {
        code == 503 && body.contains("[-]linearizable_read failed")
    })
    .await;
    assert!(body.ends_with("readyz check failed\n"), "{body}");
    wait_health(&addr.client_addr, "ftkv.v1.Kv", ServingStatus::NotServing).await;
    wait_health(&addr.client_addr, "", ServingStatus::NotServing).await;
    // Membership commands must still reach it; liveness never looks at the cluster.
    assert_eq!(
        health(&addr.client_addr, "ftkv.v1.Cluster").await,
        ServingStatus::Serving as i32
    );
    let (code, body) = http_get(&addr.status_addr, "/livez").await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));

    for &id in &followers {
        cluster.resume(id).unwrap();
    }
    let leader = cluster.wait_for_leader().await.unwrap();
    let status = cluster.node(leader).unwrap();
    wait_readyz(&status.status_addr, "healed", |code, _| code == 200).await;
    wait_health(&status.client_addr, "ftkv.v1.Kv", ServingStatus::Serving).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_services() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions {
        nodes: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.endpoint(1).unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream_once(request))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("not a service list: {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    let mut names = names;
    names.sort();
    // Exactly the client port's services: the peer port's ftkv.raft.v1.Raft is not served here.
    assert_eq!(
        names,
        [
            "ftkv.v1.Auth",
            "ftkv.v1.Cluster",
            "ftkv.v1.Kv",
            "ftkv.v1.Maintenance",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection"
        ]
    );
}

fn tokio_stream_once<T: Send + 'static>(item: T) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::iter(std::iter::once(item))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_hears_ready_and_stopping() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = tokio::net::UnixDatagram::bind(&socket_path).unwrap();
    let cluster = Cluster::start(ClusterOptions {
        nodes: 1,
        env: vec![("NOTIFY_SOCKET".into(), socket_path.display().to_string())],
        ..Default::default()
    })
    .await
    .unwrap();
    let recv_until = |want: &'static str| {
        let socket = &socket;
        async move {
            let mut got = String::new();
            let mut buf = vec![0u8; 4096];
            let deadline = Instant::now() + Duration::from_secs(60);
            while !got.lines().any(|l| l == want) {
                let left = deadline.saturating_duration_since(Instant::now());
                let n = tokio::time::timeout(left, socket.recv(&mut buf))
                    .await
                    .unwrap_or_else(|_| panic!("no {want} within 60 s; got {got:?}"))
                    .unwrap();
                got.push_str(&String::from_utf8_lossy(&buf[..n]));
                got.push('\n');
            }
            got
        }
    };
    let messages = recv_until("READY=1").await;
    assert!(messages.contains("STATUS=node 1 serving"), "{messages}");
    // READY=1 came once every port serves: the status port answers.
    let (code, _) = http_get(&cluster.node(1).unwrap().status_addr, "/livez").await;
    assert_eq!(code, 200);
    let stop = cluster.stop(1);
    let stopping = recv_until("STOPPING=1");
    let (status, stopping) = tokio::join!(stop, stopping);
    assert!(status.unwrap().success());
    assert!(stopping.contains("STATUS=draining"), "{stopping}");
}

#[test]
fn check_config_takes_the_id_from_a_statefulset_hostname() {
    let binaries = Binaries::locate();
    let run = |hostname: &str, extra: &[&str]| {
        let out = std::process::Command::new(&binaries.node)
            .args(["check-config", "--id-from-hostname"])
            .args([
                "--initial-cluster",
                "1=ftkv-0.ftkv-peer:7380,2=ftkv-1.ftkv-peer:7380,3=ftkv-2.ftkv-peer:7380",
            ])
            .args(extra)
            .env("HOSTNAME", hostname)
            .env_remove("FTKV_ID")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = run("ftkv-2", &["--advertise-peer", "ftkv-2.ftkv-peer:7380"]);
    assert!(ok, "{out}");
    assert!(out.contains("node 3 in"), "{out}");
    assert!(out.trim_end().ends_with("ok"), "{out}");
    // The pod advertises another address than initial_cluster gives its id.
    let (ok, out) = run("ftkv-1", &["--advertise-peer", "ftkv-2.ftkv-peer:7380"]);
    assert!(!ok, "{out}");
    assert!(out.contains("peers would dial the wrong address"), "{out}");
    let (ok, out) = run("ftkv", &[]);
    assert!(!ok, "{out}");
    assert!(out.contains("expected NAME-ORDINAL"), "{out}");
}
