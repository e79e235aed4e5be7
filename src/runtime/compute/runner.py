# adf's command runner inside a container (src/runtime/compute/runner.rs).
# Started once per container with `podman exec -i CONTAINER python3 -u -c
# THIS`; it keeps running and takes requests as JSON lines on stdin, so a
# command costs a fork instead of a new `podman exec`. Each command runs as
# the agent's user in a process group of its own, with a process limit; the
# group is killed at its deadline (exit 124) and when it ends (what it left
# in the background goes too); each output stream is kept to `cap` bytes
# while the rest is read and dropped. Answers are JSON lines on stdout.
import base64, json, os, resource, signal, subprocess, sys, threading, time

out_lock = threading.Lock()
groups = {}
# Kills that came before their command had started.
killed = set()
groups_lock = threading.Lock()


def say(obj):
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    with out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def drain(stream, cap, box):
    kept, cut = [], False
    size = 0
    try:
        while True:
            b = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not b:
                break
            room = cap - size
            if room > 0:
                kept.append(b[:room])
                size += min(len(b), room)
            if len(b) > room:
                cut = True
    except Exception:
        pass
    box.append((b"".join(kept), cut))


def live_in_group(pgid):
    # Members that are not zombies (a zombie waits for its reaper, and
    # killing it again changes nothing).
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                rest = f.read().rsplit(")", 1)[1].split()
            if int(rest[2]) == pgid and rest[0] != "Z":
                return True
        except (OSError, IndexError, ValueError):
            pass
    return False


def kill_group(pgid):
    # Again until no live member is left: what forked while it was killed too.
    for _ in range(200):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        if not live_in_group(pgid):
            return
        time.sleep(0.005)


def run(req):
    rid = req["id"]
    cap = int(req.get("cap", 524288))
    nproc = int(req.get("nproc", 0))
    uid, gid = req.get("uid"), req.get("gid")
    stdin = base64.b64decode(req["stdin"]) if req.get("stdin") is not None else None

    def limits():
        if nproc > 0:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    started = time.monotonic()
    try:
        kw = {}
        if uid is not None:
            kw = {"user": int(uid), "group": int(gid), "extra_groups": []}
        p = subprocess.Popen(
            req["argv"],
            cwd=req.get("cwd") or None,
            env=req.get("env"),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            process_group=0,
            preexec_fn=limits,
            **kw,
        )
    except Exception as e:
        say({"id": rid, "error": "cannot start %s: %s" % (req["argv"][0], e)})
        return
    with groups_lock:
        groups[rid] = p.pid
        early = rid in killed
        killed.discard(rid)
    if early:
        kill_group(p.pid)
    boxes = ([], [])
    readers = [threading.Thread(target=drain, args=(s, cap, b), daemon=True) for s, b in ((p.stdout, boxes[0]), (p.stderr, boxes[1]))]
    for t in readers:
        t.start()
    if stdin is not None:
        def feed():
            try:
                p.stdin.write(stdin)
                p.stdin.close()
            except Exception:
                pass
        threading.Thread(target=feed, daemon=True).start()
    timeout = max(int(req.get("timeout_ms", 30000)), 1) / 1000.0
    timed_out = False
    try:
        code = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(p.pid)
        code = p.wait()
    # What the command left running in its group ends with it.
    kill_group(p.pid)
    for t in readers:
        t.join(2.0)
    with groups_lock:
        groups.pop(rid, None)
    o, ocut = boxes[0][0] if boxes[0] else (b"", False)
    e, ecut = boxes[1][0] if boxes[1] else (b"", False)
    if code < 0:
        code = 128 - code
    if timed_out:
        code = 124
    say({
        "id": rid,
        "exit": code,
        "timed_out": timed_out,
        "stdout": base64.b64encode(o).decode(),
        "stderr": base64.b64encode(e).decode(),
        "stdout_truncated": ocut,
        "stderr_truncated": ecut,
        "ms": int((time.monotonic() - started) * 1000),
    })


def kill_uid(req):
    uid, n = int(req["uid"]), 0
    for _ in range(3):
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                if os.stat("/proc/" + d).st_uid == uid:
                    os.kill(int(d), signal.SIGKILL)
                    n += 1
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    say({"id": req["id"], "killed": n})


def known(name, uid, gid, home):
    # A passwd and group line, so `whoami`, pip and npm find the user; a
    # uid another agent has already is refused (the caller tries the next).
    with groups_lock:
        try:
            with open("/etc/passwd") as f:
                for l in f:
                    p = l.split(":")
                    if p[2:3] == [str(uid)]:
                        if p[0] == name:
                            return
                        raise OSError("uid %d belongs to %s" % (uid, p[0]))
            with open("/etc/passwd", "a") as f:
                f.write("%s:x:%d:%d::%s:/bin/bash\n" % (name, uid, gid, home))
            with open("/etc/group", "a") as f:
                f.write("%s:x:%d:\n" % (name, gid))
        except FileNotFoundError:
            pass


def prepare(req):
    # The agent's workspace: made, owned by its user, private to it.
    try:
        path, uid, gid = req["path"], int(req["uid"]), int(req["gid"])
        name = req.get("name")
        if name:
            known(name, uid, gid, path)
        os.makedirs(path, exist_ok=True)
        st = os.lstat(path)
        if not os.path.isdir(path) or os.path.islink(path):
            raise OSError("%s is not a folder" % path)
        if st.st_uid != uid or st.st_gid != gid:
            os.chown(path, uid, gid)
        os.chmod(path, int(req.get("mode", 0o700)))
        say({"id": req["id"], "ok": True})
    except Exception as e:
        say({"id": req["id"], "error": str(e)})


def main():
    say({"ready": True, "pid": os.getpid(), "python": sys.version.split()[0]})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except ValueError as e:
            say({"id": None, "error": "not JSON: %s" % e})
            continue
        op = req.get("op")
        # Taken: said before anything starts, so a host whose runner ends
        # before this line knows the request never ran.
        if req.get("id") is not None:
            say({"id": req["id"], "took": True})
        if op == "exec":
            threading.Thread(target=run, args=(req,), daemon=True).start()
        elif op == "kill":
            with groups_lock:
                pgid = groups.get(req.get("target"))
                if not pgid and len(killed) < 10000:
                    killed.add(req.get("target"))
            if pgid:
                threading.Thread(target=kill_group, args=(pgid,), daemon=True).start()
        elif op == "killuid":
            threading.Thread(target=kill_uid, args=(req,), daemon=True).start()
        elif op == "prepare":
            prepare(req)
        else:
            say({"id": req.get("id"), "error": "unknown op %r" % op})


main()
