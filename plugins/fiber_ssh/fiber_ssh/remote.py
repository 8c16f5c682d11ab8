"""The programs fiber-ssh runs on a host, sent as ``python -c CODE`` (fixed code, never built
from user input); what they need (argv, environment, secret, session) comes on stdin as JSON.

``LAUNCHER`` starts one job. Its stdout is a stream of records ``kind (1 byte) + length (4
bytes, big-endian) + payload``: ``P`` the job's pid (its process group), ``O`` a chunk of the
job's stdout, ``K`` a signal line carried out, ``X`` its exit code (negative: killed by that
signal). The job's stderr is the
launcher's own (the ssh session's stderr). Lines on stdin afterwards are signals for the job's
process group; end of stdin (the master or its connection is gone) kills the group. Once the
job ended and its group is gone, a process of the launcher's own removes what the job left in
the host's ``/dev/shm`` that no process uses (``fibercore.shm.sweep``).

``TOOL`` answers one request from the ``fiber`` command: ``info`` (CPUs, Python, fibercore),
``list`` and ``stop`` (this user's fiber jobs, found by ``FIBERCORE_SSH_JOB`` in their
environment, as fiber-local finds its own).
"""

from __future__ import annotations

LAUNCHER = r'''
import json, os, signal, struct, subprocess, sys, threading
out = sys.stdout.buffer
lock = threading.RLock()
def send(kind, data):
    with lock:
        try:
            out.write(kind + struct.pack(">I", len(data)) + data)
            out.flush()
        except OSError:  # the session is gone (the master, its connection): the job ends below
            return False
    return True
spec = json.loads(sys.stdin.buffer.readline())
env = dict(os.environ)
env.update(spec["env"])
env["FIBERCORE_SSH_JOB"] = spec["jid"]
env["FIBERCORE_SSH_NAME"] = spec["name"]
env["FIBERCORE_SSH_MASTER"] = spec.get("master", "")
r, w = os.pipe()
os.write(w, ("FIBER_SECRET=%s\n" % spec["secret"]).encode())
os.close(w)
env["FIBER_SECRET_FD"] = str(r)
cwd = spec.get("cwd")
if not (cwd and os.path.isdir(cwd)):
    cwd = None
try:
    child = subprocess.Popen(spec["argv"], env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             pass_fds=(r,), start_new_session=True)
except OSError as exc:
    sys.stderr.write("fiber-ssh: cannot start %s: %s\n" % (spec["argv"][0], exc))
    send(b"X", b"127")
    os._exit(0)
os.close(r)
send(b"P", str(child.pid).encode())
def signal_group(sig):
    try:
        os.killpg(child.pid, sig)
    except OSError:
        pass
def control():
    for line in sys.stdin.buffer:
        if line.strip():
            with lock:  # the answer goes before the exit record the signal may cause
                signal_group(int(line))
                send(b"K", line.strip())  # the host carried it out: it is not cut off
    signal_group(signal.SIGKILL)
threading.Thread(target=control, daemon=True).start()
while True:
    chunk = child.stdout.read1(65536)
    if not chunk:
        break
    if not send(b"O", chunk):
        signal_group(signal.SIGKILL)  # nobody to tell: the job goes, its output is read to the end
# Once the job's group is gone, what it left in this host's /dev/shm that no process uses (a
# shared() object's copy, a parameter board: the resource tracker that would have removed them
# died with the group) goes, by fibercore's own sweep, in a process of its own (the session, and
# the master's wait for the job's end, end now), started as the job was (its Python, directory
# and environment, without the job's marks: it is no job).
SWEEPER = """
import os, sys, time
pgid = int(sys.argv[1])
def group_alive():
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/stat" % pid, "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != b"Z":
                    return True
            except (OSError, ValueError, IndexError):
                pass
    return False
deadline = time.monotonic() + 10
while group_alive() and time.monotonic() < deadline:
    time.sleep(0.01)
from fibercore.shm import sweep
sweep()
"""
code = child.wait()
signal_group(signal.SIGKILL)
send(b"X", str(code).encode())
try:
    quiet = {k: v for k, v in env.items() if not k.startswith("FIBERCORE_SSH_") and k != "FIBER_SECRET_FD"}
    subprocess.Popen([spec["argv"][0], "-c", SWEEPER, str(child.pid)], env=quiet, cwd=cwd, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
except OSError:
    pass
os._exit(0)  # not sys.exit: the control thread may be inside a read of stdin
'''

TOOL = r'''
import json, os, signal, sys
request = json.loads(sys.stdin.readline())
def fiber_jobs():
    me = os.getuid()
    here = os.readlink("/proc/self/ns/pid")  # a container on this kernel is another host
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.stat("/proc/" + pid).st_uid != me:
                continue
            with open("/proc/%s/environ" % pid, "rb") as fh:
                env = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
            leader = os.getpgid(int(pid)) == int(pid) and os.readlink("/proc/%s/ns/pid" % pid) == here
        except OSError:
            continue  # gone meanwhile, or not ours
        jid = env.get(b"FIBERCORE_SSH_JOB")
        if jid and leader:
            yield (int(pid), jid.decode(), env.get(b"FIBERCORE_SSH_NAME", b"?").decode(),
                   env.get(b"FIBERCORE_SSH_MASTER", b"").decode())
kind = request["kind"]
if kind == "info":
    try:
        import fibercore
        version = getattr(fibercore, "__version__", "?")
    except Exception as exc:
        version = None
    print(json.dumps({"cpus": os.cpu_count(), "python": sys.version.split()[0], "fibercore": version}))
elif kind == "list":
    print(json.dumps([list(job) for job in fiber_jobs() if job[1].startswith(request["prefix"])]))
elif kind == "stop":
    stopped = 0
    for pid, jid, name, _master in fiber_jobs():
        if jid.startswith(request["prefix"]):
            try:
                os.killpg(pid, signal.SIGKILL)
                stopped += 1
            except OSError:
                pass
    print(json.dumps(stopped))
'''
