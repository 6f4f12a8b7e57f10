//! Issue 16 acceptance 5 and issue 17 acceptance 5: the README's operational commands are a
//! runbook that works as written. Every ```` ```sh ```` block of the sections "Running nodes
//! yourself", "Security (TLS)" and "Operations" (with their subsections) carries an HTML comment
//! just before it: `<!-- runbook: NAME -->` (this test runs it) or `<!-- runbook-skip: REASON -->`
//! (it needs Docker, systemd, Kubernetes or other hosts; REASON names the test that covers it).
//! An unmarked block fails the test.
//!
//! The marked blocks run in README order with bash (`set -euo pipefail`), one shell per
//! top-level (`##`) section, as a user pastes them into one terminal: variables and functions
//! of a block stay for the next ones, a failing command ends the shell and fails the test. `PATH`
//! starts with the folder of the built `ftkv-node` and `ftkvctl` (as the cluster fixture finds
//! them: `cargo build -p ftkv-node -p ftkv-client --bins` first), no `FTKV_*` variable is
//! inherited, and every `/tmp/` of a block is replaced by a fresh temporary folder (also the
//! shell's working directory), so the test is hermetic while a user's copy works as written.
//! At the end of a section everything its shell started is stopped (its process group).
//! Besides the exit codes, the test checks what the README says a block shows: the restored
//! cluster has the keys and a new cluster id, a learner is promoted and listed, the quota alarm
//! is listed and disarmed, the rotated certificate is the one served, users and roles grant and
//! refuse what they should.
//!
//! Fixed ports: the blocks use the README's playground ports 127.0.0.1:7379-7390 (three nodes
//! at 7379-7387, a fourth at 7388-7390); the test fails at once, naming the port, when one is
//! taken. Needs `bash`, `curl` and `openssl` (`awk`, `grep`, `head`, `seq` from coreutils).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)] // a failure is the test failing

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ftkv_tests::fixture::Binaries;

/// Sections whose every `sh` block must be marked.
const RUNBOOK_SECTIONS: &[&str] = &["Running nodes yourself", "Security (TLS)", "Operations"];

/// The ports the README's blocks use.
const PORTS: std::ops::RangeInclusive<u16> = 7379..=7390;

/// Longest a single block may run.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(120);

/// What the comment before a code block says.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mark {
    /// `<!-- runbook: NAME -->`.
    Run(String),
    /// `<!-- runbook-skip: REASON -->`.
    Skip(String),
    /// No runbook comment.
    None,
}

/// One fenced code block of the README.
#[derive(Debug, Clone)]
struct Block {
    /// The `##` section it is in.
    section: String,
    /// 1-based line of the opening fence.
    line: usize,
    /// The fence's info string (`sh`, `rust`, empty).
    lang: String,
    mark: Mark,
    text: String,
}

fn parse_mark(line: &str) -> Option<Mark> {
    let inner = line.trim().strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    if let Some(reason) = inner.strip_prefix("runbook-skip:") {
        return Some(Mark::Skip(reason.trim().to_string()));
    }
    inner
        .strip_prefix("runbook:")
        .map(|name| Mark::Run(name.trim().to_string()))
}

/// Every fenced code block of `readme`, with its section and the runbook comment right before it.
fn parse(readme: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut section = String::new();
    let mut previous = "";
    let mut open: Option<Block> = None;
    for (index, line) in readme.lines().enumerate() {
        if let Some(block) = open.as_mut() {
            if line.trim_start().starts_with("```") {
                blocks.push(open.take().unwrap());
            } else {
                block.text.push_str(line);
                block.text.push('\n');
            }
            continue;
        }
        if let Some(fence) = line.trim_start().strip_prefix("```") {
            open = Some(Block {
                section: section.clone(),
                line: index + 1,
                lang: fence.trim().to_string(),
                mark: parse_mark(previous).unwrap_or(Mark::None),
                text: String::new(),
            });
        } else if let Some(title) = line.strip_prefix("## ") {
            section = title.trim().to_string();
        }
        if !line.trim().is_empty() {
            previous = line;
        }
    }
    assert!(open.is_none(), "README.md ends inside a code block");
    blocks
}

/// The README's runnable blocks, after checking that every `sh` block of the runbook sections
/// is either run or skipped with a reason, and that names are unique.
fn runbook(readme: &str) -> Vec<Block> {
    let blocks = parse(readme);
    let mut problems = Vec::new();
    let mut names = BTreeMap::new();
    for block in &blocks {
        let in_scope = RUNBOOK_SECTIONS.contains(&block.section.as_str());
        match &block.mark {
            Mark::None if in_scope && block.lang == "sh" => problems.push(format!(
                "README.md:{}: a sh block in \"{}\" is neither `<!-- runbook: NAME -->` nor \
                 `<!-- runbook-skip: REASON -->`",
                block.line, block.section
            )),
            Mark::Skip(reason) if reason.is_empty() => {
                problems.push(format!("README.md:{}: runbook-skip without a reason", block.line))
            }
            Mark::Run(name) if name.is_empty() || block.lang != "sh" => problems.push(format!(
                "README.md:{}: a runbook block needs a name and the language sh",
                block.line
            )),
            Mark::Run(name) => {
                if let Some(first) = names.insert(name.clone(), block.line) {
                    problems.push(format!(
                        "README.md:{}: runbook name {name:?} already used at line {first}",
                        block.line
                    ));
                }
            }
            _ => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    blocks
        .into_iter()
        .filter(|b| matches!(b.mark, Mark::Run(_)))
        .collect()
}

fn name(block: &Block) -> &str {
    match &block.mark {
        Mark::Run(name) => name,
        _ => "",
    }
}

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Sends `signal` (a `kill` name: TERM, KILL) to process group `pgid`, through the `kill`
/// utility (no unsafe code here).
fn kill_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

fn taken_port() -> Option<u16> {
    PORTS
        .clone()
        .find(|&port| TcpListener::bind(("127.0.0.1", port)).is_err())
}

/// One bash process (and every process it started: its process group) running the blocks of
/// one section. Dropping it stops them all.
struct Shell {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    dir: PathBuf,
}

/// What a block printed (stdout and stderr, interleaved) and whether the shell survived it.
struct Outcome {
    output: String,
    ok: bool,
}

impl Shell {
    fn start(bin_dir: &Path, dir: &Path) -> Shell {
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = Command::new("bash");
        command
            .args(["--noprofile", "--norc"])
            .current_dir(dir)
            .env("PATH", path)
            .env("TMPDIR", dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("FTKV_") {
                command.env_remove(key);
            }
        }
        let mut child = command.spawn().expect("bash");
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut shell = Shell {
            stdin: child.stdin.take(),
            child,
            lines,
            dir: dir.to_path_buf(),
        };
        shell.send("exec 2>&1\nset -euo pipefail\n");
        shell
    }

    fn send(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("shell input open");
        stdin.write_all(text.as_bytes()).expect("write to bash");
        stdin.flush().expect("flush bash input");
    }

    /// Runs `block` (with `/tmp/` replaced by the test folder) by `source`-ing it from a file
    /// (stdin `/dev/null`, as a terminal user's block does not read the rest of the runbook),
    /// then prints a sentinel; the block's output is everything up to the sentinel.
    fn run(&mut self, index: usize, block: &Block) -> Outcome {
        let text = block.text.replace("/tmp/", &format!("{}/", self.dir.display()));
        let file = self.dir.join(format!("runbook-{index:02}-{}.sh", name(block)));
        std::fs::write(&file, text).unwrap();
        let sentinel = format!("@@runbook-block-{index}-done@@");
        self.send(&format!(
            "source '{}' < /dev/null\nprintf '\\n%s\\n' '{sentinel}'\n",
            file.display()
        ));
        let deadline = Instant::now() + BLOCK_TIMEOUT;
        let mut output = String::new();
        // A background process of the block may hold the pipe open after bash exited: poll
        // bash itself rather than wait for the end of its output.
        let mut exited = None;
        loop {
            match self.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(line) if line == sentinel => return Outcome { output, ok: true },
                Ok(line) => {
                    output.push_str(&line);
                    output.push('\n');
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_millis(50)),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if let Some(status) = exited {
                output.push_str(&format!("[bash exited: {status}]\n"));
                return Outcome { output, ok: false };
            }
            // Once bash is gone, one more round collects what it printed last.
            exited = self.child.try_wait().ok().flatten();
            if exited.is_none() && Instant::now() > deadline {
                output.push_str(&format!("[still running after {BLOCK_TIMEOUT:?}]\n"));
                return Outcome { output, ok: false };
            }
        }
    }

    /// Ends the shell and everything it started: SIGTERM to the group (the nodes drain), then
    /// SIGKILL once the ports are free or after 20 s.
    fn stop(&mut self) {
        self.stdin = None;
        let pgid = self.child.id();
        kill_group(pgid, "TERM");
        let deadline = Instant::now() + Duration::from_secs(20);
        while taken_port().is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        kill_group(pgid, "KILL");
        let _ = self.child.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Some(port) = taken_port() {
            assert!(
                Instant::now() < deadline,
                "port {port} still taken after the section's processes were stopped"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        kill_group(self.child.id(), "KILL");
        let _ = self.child.wait();
    }
}

/// The tails of every `*.log` under `dir` (node logs), for a failure message.
fn log_tails(dir: &Path) -> String {
    let mut out = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "log" || e == "out") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n");
                out.push_str(&format!("--- {} (last 15 lines)\n{tail}\n", path.display()));
            }
        }
    }
    out
}

/// `"cluster_id":"..."` values in `output`, in order.
fn cluster_ids(output: &str) -> Vec<String> {
    output
        .match_indices("\"cluster_id\":\"")
        .map(|(at, marker)| {
            let rest = &output[at + marker.len()..];
            rest[..rest.find('"').unwrap_or(rest.len())].to_string()
        })
        .collect()
}

/// The lines of the last membership listing in `output` (simple format: `ID, ROLE, CLIENT,
/// PEER, leader|-`, ids ascending), as (id, role) pairs.
fn last_member_list(output: &str) -> Vec<(u64, String)> {
    let mut lists: Vec<Vec<(u64, String)>> = Vec::new();
    let mut current: Option<Vec<(u64, String)>> = None;
    for line in output.lines() {
        let fields: Vec<&str> = line.split(", ").collect();
        let parsed = (fields.len() == 5)
            .then(|| {
                fields[0]
                    .parse::<u64>()
                    .ok()
                    .map(|id| (id, fields[1].to_string()))
            })
            .flatten();
        // A listing is in id order: a smaller or equal id starts the next listing.
        match (parsed, current.as_mut()) {
            (Some(member), Some(list)) if list.last().is_some_and(|last| last.0 < member.0) => {
                list.push(member)
            }
            (Some(member), Some(_)) => lists.extend(current.replace(vec![member])),
            (Some(member), None) => current = Some(vec![member]),
            (None, _) => lists.extend(current.take()),
        }
    }
    lists.extend(current.take());
    lists.pop().unwrap_or_default()
}

fn voters(members: &[(u64, String)]) -> Vec<u64> {
    members
        .iter()
        .filter(|(_, role)| role == "voter")
        .map(|(id, _)| *id)
        .collect()
}

fn pid_in(dir: &Path, node: &str) -> String {
    std::fs::read_to_string(dir.join(node).join("LOCK")).unwrap_or_default()
}

fn assert_has(block: &str, output: &str, wanted: &str) {
    assert!(
        output.contains(wanted),
        "block {block}: the output lacks {wanted:?}:\n{output}"
    );
}

/// State the checks compare across blocks.
#[derive(Default)]
struct Memory {
    old_cluster_id: Option<String>,
    node_pids: Vec<String>,
    rotated_cert: Option<Vec<u8>>,
}

/// Before block `name`: what its check compares against.
fn before(name: &str, dir: &Path, memory: &mut Memory) {
    match name {
        "rolling-restart" => {
            memory.node_pids = (1..=3)
                .map(|i| pid_in(&dir.join("ftkv-nodes"), &i.to_string()))
                .collect();
        }
        "tls-rotate" => memory.rotated_cert = std::fs::read(dir.join("ftkv-tls/tls/node-1.pem")).ok(),
        _ => {}
    }
}

/// After block `name` ran with `output`: what the README says it shows.
fn check(name: &str, output: &str, dir: &Path, memory: &mut Memory) {
    match name {
        "tls-playground" => {
            assert_has(name, output, "world");
            assert_has(name, output, "this port requires TLS");
            assert_has(name, output, "[+]leader ok");
        }
        "tls-rotate" => {
            let fingerprints: Vec<&str> = output
                .lines()
                .filter(|l| l.to_lowercase().starts_with("sha256 fingerprint="))
                .collect();
            assert_eq!(fingerprints.len(), 2, "{output}");
            assert_eq!(
                fingerprints[0], fingerprints[1],
                "node 1 does not serve the new certificate"
            );
            let now = std::fs::read(dir.join("ftkv-tls/tls/node-1.pem")).unwrap();
            assert_ne!(
                memory.rotated_cert.as_deref(),
                Some(now.as_slice()),
                "node-1.pem unchanged"
            );
            let log = std::fs::read_to_string(dir.join("ftkv-tls/node-1.log")).unwrap();
            assert!(log.contains("TLS certificates reloaded"), "no reload logged");
        }
        "k8s-certs" => {
            assert_has(name, output, "DNS:ftkv-node-1");
            assert_has(name, output, "DNS:ftkv-0.ftkv-peer");
            for i in 0..3 {
                assert!(dir
                    .join(format!("ftkv-k8s-certs/node-{}-key.pem", i + 1))
                    .is_file());
            }
        }
        "users-roles" => {
            assert_has(name, output, "User root created");
            assert_has(name, output, "Authentication Enabled");
            assert_has(name, output, "Error: unauthenticated");
            assert_has(
                name,
                output,
                "Error: permission denied: user \"alice\" has no WRITE permission on key \"other\"",
            );
            assert_has(name, output, "lacks the root role");
            assert_has(name, output, "app/x\n1\n");
            assert_has(name, output, "Authentication Disabled");
        }
        "start-playground" | "start-by-hand" => {
            assert_eq!(output.matches("is healthy").count() % 3, 0, "{output}");
            assert!(output.contains("is healthy"), "{output}");
            if name == "start-by-hand" {
                let members = last_member_list(output);
                assert_eq!(voters(&members), vec![1, 2, 3], "{output}");
            }
        }
        "metrics" => {
            assert_has(name, output, "ftkv_server_has_leader 1");
            assert_has(name, output, "ftkv_build_info{");
            assert_has(name, output, "[+]leader ok");
        }
        "stop" => assert_has(name, output, "drained outcome"),
        "rolling-restart" => {
            let now: Vec<String> = (1..=3)
                .map(|i| pid_in(&dir.join("ftkv-nodes"), &i.to_string()))
                .collect();
            for (i, (before, after)) in memory.node_pids.iter().zip(&now).enumerate() {
                assert_ne!(before, after, "node {} was not restarted", i + 1);
            }
        }
        "member-add" => {
            assert_has(name, output, "Member 4 added as a learner");
            assert_has(name, output, "Member 4 promoted to voter");
            assert_eq!(voters(&last_member_list(output)), vec![1, 2, 3, 4], "{output}");
        }
        "member-remove" => {
            assert_has(name, output, "Member 4 removed");
            let members = last_member_list(output);
            assert!(members.iter().all(|(id, _)| *id != 4), "{output}");
            assert_eq!(voters(&members), vec![1, 2, 3], "{output}");
        }
        "member-replace" => {
            assert_has(name, output, "Member 5 promoted to voter");
            let members = last_member_list(output);
            assert_eq!(voters(&members), vec![1, 2, 5], "{output}");
            assert_eq!(members.len(), 3, "{output}");
        }
        "backup" => {
            assert_has(name, output, "Snapshot saved at");
            assert_has(name, output, "keys: 100");
            memory.old_cluster_id = cluster_ids(output).pop();
            assert!(memory.old_cluster_id.is_some(), "{output}");
        }
        "restore" => {
            let ids = cluster_ids(output);
            assert_eq!(ids.len(), 3, "one status per restored node: {output}");
            assert!(ids.iter().all(|id| id == &ids[0]), "{output}");
            assert_ne!(
                Some(&ids[0]),
                memory.old_cluster_id.as_ref(),
                "the same cluster id"
            );
            assert_has(name, output, "user/42\nvisits=42\n");
        }
        "quota-alarm" => {
            assert_has(name, output, "no space");
            assert_has(name, output, "alarm:NOSPACE");
            assert_has(name, output, "limit:space.quota_bytes");
            // Disarmed: the write after it is accepted (the leader refuses every write other
            // than deletes while its alarm is raised).
            let lines: Vec<&str> = output.lines().filter(|l| !l.trim().is_empty()).collect();
            assert_eq!(lines.last(), Some(&"OK"), "{output}");
        }
        _ => {}
    }
}

/// Blocks whose output this test checks: renaming or dropping one in the README must fail here.
const CHECKED: &[&str] = &[
    "tls-playground",
    "tls-rotate",
    "k8s-certs",
    "users-roles",
    "start-playground",
    "start-by-hand",
    "metrics",
    "stop",
    "rolling-restart",
    "member-add",
    "member-remove",
    "member-replace",
    "backup",
    "restore",
    "quota-alarm",
];

#[test]
fn every_operational_block_is_run_or_skipped_with_a_reason() {
    let blocks = runbook(&readme());
    let names: Vec<&str> = blocks.iter().map(name).collect();
    for wanted in CHECKED {
        assert!(
            names.contains(wanted),
            "README.md has no `<!-- runbook: {wanted} -->` block"
        );
    }
}

#[test]
fn the_parser_sees_marks_and_sections() {
    let text = "## Operations\n\n<!-- runbook: a -->\n```sh\necho a\n```\n\ntext\n\n```sh\nb\n```\n\
                ## Other\n<!-- runbook-skip: why -->\n```sh\nc\n```\n```rust\nd\n```\n";
    let blocks = parse(text);
    assert_eq!(blocks.len(), 4);
    assert_eq!(blocks[0].mark, Mark::Run("a".into()));
    assert_eq!(blocks[0].text, "echo a\n");
    assert_eq!(blocks[1].mark, Mark::None);
    assert_eq!(blocks[2].mark, Mark::Skip("why".into()));
    assert_eq!(blocks[2].section, "Other");
    assert_eq!(blocks[3].lang, "rust");
    let result = std::panic::catch_unwind(|| runbook(text));
    assert!(
        result.is_err(),
        "the unmarked sh block of Operations must be refused"
    );
}

#[test]
fn the_readme_runbook_runs_as_written() {
    let blocks = runbook(&readme());
    let binaries = Binaries::locate();
    let bin_dir = binaries.node.parent().unwrap().to_path_buf();
    if let Some(port) = taken_port() {
        panic!("port {port} is taken: this test needs 127.0.0.1:7379-7390 (the README's ports)");
    }
    let started = Instant::now();
    let mut sections: Vec<(String, Vec<Block>)> = Vec::new();
    for block in blocks {
        match sections.last_mut() {
            Some((section, list)) if *section == block.section => list.push(block),
            _ => sections.push((block.section.clone(), vec![block])),
        }
    }
    let mut index = 0;
    for (section, blocks) in sections {
        let temp = tempfile::Builder::new()
            .prefix("ftkv-runbook-")
            .tempdir()
            .unwrap();
        let dir = temp.path().canonicalize().unwrap();
        let mut shell = Shell::start(&bin_dir, &dir);
        let mut memory = Memory::default();
        for block in &blocks {
            index += 1;
            let name = name(block);
            let at = Instant::now();
            before(name, &dir, &mut memory);
            let outcome = shell.run(index, block);
            if !outcome.ok {
                panic!(
                    "README.md:{} block {name} ({section}) failed:\n{}\n{}",
                    block.line,
                    outcome.output,
                    log_tails(&dir)
                );
            }
            // Shown on a failure (and with --nocapture): what every block printed.
            eprintln!("runbook: {name} ok in {:.1?}\n{}", at.elapsed(), outcome.output);
            check(name, &outcome.output, &dir, &mut memory);
        }
        shell.stop();
    }
    eprintln!("runbook: all blocks in {:.1?}", started.elapsed());
}
