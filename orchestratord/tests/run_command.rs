//! LLS-RUN-1 (issue 50): `orchestratord run MODEL`, driven through a pseudo-terminal as a user
//! types into it (Python's `pty`): with no server at the address it serves the GGUF in
//! process; a question is answered in the terminal; Ctrl-C while an answer is written stops
//! that answer and the conversation goes on (the next question is answered); Ctrl-C at the
//! prompt says how to leave; `/bye` ends it with status 0. With a PROMPT, against a server
//! that already answers at the address, one answer is printed and the command ends without
//! starting another server.

mod support;

use std::process::Command;

use support::procs::*;

/// Drives the command in a pseudo-terminal; prints what it saw, exits non-zero on a failure.
const DRIVER: &str = r#"
import os, pty, sys, time, select
binary, model, port, config = sys.argv[1:5]
pid, fd = pty.fork()
if pid == 0:
    os.execv(binary, [binary, "--config", config, "--bind", "127.0.0.1:" + port, "run", model])
seen = b""
def until(marker, timeout):
    global seen
    end = time.time() + timeout
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            seen += chunk
            if marker.encode() in seen:
                out = seen
                seen = seen[seen.index(marker.encode()) + len(marker):]
                return out.decode(errors="replace")
    sys.exit("timed out waiting for %r; saw %r" % (marker, seen))
def say(text):
    os.write(fd, text.encode())
until(">>> ", 120)
say("What is the capital of France?\n")
first = until(">>> ", 60)
print("FIRST:", repr(first))
if len(first.strip()) < 3:
    sys.exit("no answer: %r" % first)
say("Count from 1 to 400, one number per line.\n")
until("3", 60)          # the answer is being written
say("\x03")             # Ctrl-C
stopped = until(">>> ", 30)
print("STOPPED:", repr(stopped))
if "[stopped]" not in stopped:
    sys.exit("the answer was not stopped: %r" % stopped)
say("\x03")             # Ctrl-C at the prompt
hint = until(">>> ", 10)
if "/bye" not in hint:
    sys.exit("no hint: %r" % hint)
say("Say yes.\n")
after = until(">>> ", 60)
print("AFTER:", repr(after))
if len(after.strip()) < 1:
    sys.exit("no answer after the stop")
say("/bye\n")
end = time.time() + 30
while time.time() < end:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        code = os.waitstatus_to_exitcode(status)
        print("EXIT:", code)
        sys.exit(0 if code == 0 else "exit status %d" % code)
    try:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            os.read(fd, 4096)
    except OSError:
        pass
sys.exit("did not end after /bye")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_chats_in_a_terminal_stops_an_answer_on_ctrl_c_and_ends_on_bye() {
    let dir = scratch("run-cmd");
    let script = dir.join("drive.py");
    std::fs::write(&script, DRIVER).unwrap();
    let config = dir.join("config.toml");
    // long enough answers for Ctrl-C to land in one
    std::fs::write(&config, "[admission]\ndefault_max_tokens = 300\n").unwrap();
    let port = free_port();
    let out = Command::new("python3")
        .env("ORCHD_RECORDS_PATH", dir.join("records.sqlite3"))
        .arg(&script)
        .arg(orchestratord_binary())
        .arg(support::default_model_path())
        .arg(port.to_string())
        .arg(&config)
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("EXIT: 0"), "{text}");

    // a server already answers: one answer to the PROMPT, nothing started
    let (_p, base) = server(&format!(
        "[[pools]]\nid = \"p\"\nmodel = \"{}\"\nalias = \"smol\"\nslots = 1\nctx = 512\n",
        support::default_model_path()
    ))
    .await;
    let bind = base.trim_start_matches("http://").to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(orchestratord_binary())
            .args(["--bind", &bind, "run", "smol", "Name", "a", "colour."])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // (a server of its own could not have bound the address: the answer is the running one's)
    assert!(said.trim().len() >= 2, "{said:?}");
}
