"""PreToolUse guards: refuse the launch mistakes that waste a GPU window, before they run.

Each rule is a pure function ``(Call) -> reason | None``; a deny says the rule, the why in a
clause, and the corrected command when one can be derived. A guard decides on purpose, never
by crashing: bad input or an internal error allows the call (and says so on stderr).
``SUPERVISE_GUARD_OFF=rule,rule`` switches rules off. Standard library only: hot path.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

BUNDLE = Path(__file__).resolve().parents[1]
QUIET = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
OWN_SCRIPTS = re.compile(r"(^|/)scripts/(watchdog|checkin|bench|audit|smoke|plot|demo)\.py$")
PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)?)?$")
LAUNCHERS = {"torchrun", "deepspeed"}
LOG_FILE = re.compile(r"(\.log|\.out|\.err|\.txt)$|(^|/)nohup\.out$")
BIG = 256 << 10
MAX_TAIL = 200
CREDENTIALS = ("~/.git-credentials", "~/.netrc", "~/.aws/credentials", "~/.config/gh/hosts.yml",
               "~/.cache/huggingface/token", "~/.huggingface/token", "~/.ssh/id_", "~/.docker/config.json",
               "~/.kaggle/kaggle.json", "~/.config/huggingface/token")
SECRET_VAR = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD", re.I)
OPERATORS = {"&&", "||", ";", "|", "&", "|&", ";;", "(", ")"}
ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class Call:
    """One tool call as the hook sees it."""

    tool: str
    command: str = ""
    background: bool = False
    cwd: str = "."
    env: dict = field(default_factory=dict)
    content: str = ""
    path: str = ""


def tokens(command: str) -> list[str]:
    """Words and operators, split by a real shell lexer (quotes kept together)."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=";&|()")
    lex.whitespace_split = True
    lex.commenters = ""
    return list(lex)


def simple_commands(command: str) -> list[tuple[list[str], str]]:
    """[(words, operator that follows)] for each simple command of a chain or pipeline."""
    out, cur = [], []
    for t in tokens(command):
        if t in OPERATORS:
            out.append((cur, t))
            cur = []
        else:
            cur.append(t)
    out.append((cur, ""))
    return [(w, op) for w, op in out if w]


def _split_env(words: list[str]) -> tuple[dict, list[str]]:
    """Leading VAR=value assignments (also after ``env``) and the rest."""
    env, i = {}, 0
    while i < len(words):
        w = words[i]
        if ENV_ASSIGN.match(w):
            k, _, v = w.partition("=")
            env[k] = v
        elif w == "env" and i + 1 < len(words):
            pass
        else:
            break
        i += 1
    return env, words[i:]


def _launch(words: list[str]) -> Optional[dict]:
    """A Python launch in this simple command: {'env', 'argv', 'kind', 'at'} or None."""
    env, rest = _split_env(words)
    for wrapper in ("nohup", "setsid", "exec", "time", "nice"):
        if rest and rest[0] == wrapper:
            rest = rest[1:]
    if not rest:
        return None
    exe = rest[0]
    if PYTHON.match(exe):
        kind = "python"
    elif exe in LAUNCHERS:
        kind = exe
    elif exe == "accelerate" and rest[1:2] == ["launch"]:
        kind = "accelerate"
    elif exe == "uv" and rest[1:2] == ["run"]:
        kind = "uv"
    else:
        return None
    script = next((w for w in rest[1:] if w.endswith(".py")), "")
    return {"env": env, "argv": rest, "kind": kind, "script": script}


def _own(launch: dict) -> bool:
    s = launch["script"]
    return bool(OWN_SCRIPTS.search(s)) or (s and Path(s).resolve().is_relative_to(BUNDLE / "scripts"))


def _exported(command: str) -> dict:
    env = {}
    for words, _ in simple_commands(command):
        if words[0] == "export":
            for w in words[1:]:
                if ENV_ASSIGN.match(w):
                    k, _, v = w.partition("=")
                    env[k] = v
    return env


def _launches(call: Call) -> list[dict]:
    try:
        return [x for x in (_launch(w) for w, _ in simple_commands(call.command)) if x]
    except ValueError:
        return []


def _missing(call: Call, launch: dict) -> list[str]:
    have = {**call.env, **_exported(call.command), **launch["env"]}
    return [k for k, v in QUIET.items() if have.get(k) != v]


def _buffered(call: Call, launch: dict) -> bool:
    have = {**call.env, **_exported(call.command), **launch["env"]}
    if have.get("PYTHONUNBUFFERED", "") not in ("", "0"):
        return False
    return not (launch["kind"] == "python" and any(a == "-u" or (a.startswith("-") and not a.startswith("--")
                                                                and "u" in a[1:] and len(a) < 6)
                                                    for a in launch["argv"][1:3]))


def one_line(command: str) -> Optional[str]:
    """The command joined onto one physical line, or None when it cannot be done safely."""
    text = re.sub(r"[ \t]*\\\n\s*", " ", command.strip())
    if "<<" in text:
        return None
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    try:
        for ln in lines:
            tokens(ln)
    except ValueError:  # a quote spans lines: a multi-line -c string
        return None
    joined = ""
    for ln in lines:
        if not joined:
            joined = ln
        elif re.search(r"(&&|\|\||\||;|&)$", joined):
            joined += " " + ln
        else:
            joined += " && " + ln
    return joined


def fix_env(call: Call, command: str) -> str:
    """Add -u and the missing quiet variables to each training launch in ``command``, each
    launch's own word in turn (searching on from the last one, so two launches of ``python``
    are each fixed once and the bundle's own scripts are passed over)."""
    sub = Call(call.tool, command, call.background, call.cwd, call.env)
    out, pos = command, 0
    for launch in _launches(sub):
        head = shlex.quote(launch["argv"][0])
        m = re.compile(r"(?<![\w/.=-])" + re.escape(head) + r"(?![\w.])").search(out, pos)
        if m is None:
            continue
        if _own(launch):
            pos = m.end()
            continue
        buffered = _buffered(sub, launch)
        prefix = " ".join(f"{k}={v}" for k, v in {**({"PYTHONUNBUFFERED": "1"} if buffered else {}),
                                                     **{k: QUIET[k] for k in _missing(sub, launch)}}.items())
        new_head = head + (" -u" if launch["kind"] == "python" and buffered else "")
        new_head = f"{prefix} {new_head}" if prefix else new_head
        out = out[:m.start()] + new_head + out[m.end():]
        pos = m.start() + len(new_head)
    return out


def corrected(call: Call) -> Optional[str]:
    cmd = one_line(call.command) if "\n" in call.command.strip() else call.command.strip()
    return fix_env(call, cmd) if cmd else None


def _deny(rule: str, why: str, fix: Optional[str]) -> str:
    reason = f"[{rule}] {why}"
    return reason + (f" Run instead: {fix}" if fix else "")


# ----------------------------------------------------------------------------- the rules
def rule_one_line(call: Call) -> Optional[str]:
    if call.tool != "Bash" or not call.background or "\n" not in call.command.strip():
        return None
    fix = corrected(call)
    return _deny("one_line", "A background command must be ONE physical line: its newlines can collapse into "
                 "spaces and run as one broken command while the GPU sits at 0%." +
                 ("" if fix else " Put the steps in a script file and launch that."), fix)


def rule_unbuffered(call: Call) -> Optional[str]:
    if call.tool != "Bash" or not call.background or "\n" in call.command.strip():
        return None
    if any(not _own(x) and _buffered(call, x) for x in _launches(call)):
        return _deny("unbuffered", "A background Python launch needs -u or PYTHONUNBUFFERED=1, or its log "
                     "stays empty for minutes and hides progress and errors.", corrected(call))
    return None


def rule_quiet_env(call: Call) -> Optional[str]:
    if call.tool != "Bash" or not call.background or "\n" in call.command.strip():
        return None
    missing = list(dict.fromkeys(k for x in _launches(call) if not _own(x) for k in _missing(call, x)))
    if missing:
        return _deny("quiet_env", f"Set {', '.join(missing)}: progress bars fill the log with thousands of "
                     "lines that bury the real error.", corrected(call))
    return None


DETACH = re.compile(r"(^|[\s;&|(])(nohup|setsid|disown)(\s|$)|tmux\s+new(-session)?\b.*\s-d|screen\s+-d?m")


def rule_notified(call: Call) -> Optional[str]:
    if call.tool != "Bash" or call.background:
        return None
    try:
        parts = simple_commands(call.command)
    except ValueError:
        return None
    text = call.command
    trains = bool(_launches(call)) or bool(re.search(r"python\d*(\.\d+)?\s|torchrun|accelerate\s+launch|deepspeed", text))
    detached = any(op == "&" for _, op in parts) or DETACH.search(text)
    if not (trains and detached):
        return None
    fix = " ".join(w for w in re.sub(r"\s*&\s*$", "", re.sub(r"\bdisown\b\s*;?", "", text)).split()
                   if w not in ("nohup", "setsid")).strip().rstrip("&").rstrip(";").strip()
    fix = fix_env(call, fix) if "\n" not in fix and not DETACH.search(fix) else None
    return _deny("notified", "A detached launch (&, nohup, setsid, disown, tmux -d, screen -dm) never wakes "
                 "you when it ends: run it with run_in_background: true instead.", fix)


def _size(call: Call, path: str) -> int:
    p = Path(os.path.expanduser(path))
    p = p if p.is_absolute() else Path(call.cwd) / p
    try:
        return p.stat().st_size
    except OSError:
        return -1


def _tail_n(args: list[str]) -> Optional[int]:
    for i, a in enumerate(args):
        m = re.match(r"^(?:-n|--lines=?)(\+?\d+)$", a) or re.match(r"^-(\d+)$", a)
        if m:
            return int(m.group(1).lstrip("+"))
        if a in ("-n", "--lines") and i + 1 < len(args) and args[i + 1].lstrip("+").isdigit():
            return int(args[i + 1].lstrip("+"))
    return None


def rule_no_log_dumps(call: Call) -> Optional[str]:
    if call.tool != "Bash":
        return None
    try:
        parts = simple_commands(call.command)
    except ValueError:
        return None
    for words, op in parts:
        if op in ("|", "|&"):
            continue  # its output is filtered further down the pipe
        _, words = _split_env(words)
        if not words:
            continue
        exe, args = os.path.basename(words[0]), words[1:]
        files = [a for a in args if not a.startswith("-") and not a.lstrip("+").isdigit()]
        if exe in ("cat", "less", "more", "bat"):
            big = [f for f in files if _size(call, f) > BIG]
            if big:
                return _deny("no_log_dumps", f"{big[0]} is {_size(call, big[0]) // 1024} KiB: dumping it floods "
                             "the context.", "python " + str(BUNDLE / "scripts" / "checkin.py") +
                             f" {shlex.quote(os.path.dirname(big[0]) or '.')} (or tail -n 20 metrics.jsonl, or "
                             f"grep -avE \"it/s|Materializing|Loading weights\" {shlex.quote(big[0])} | tail -n 50)")
        if exe in ("head", "tail") and "-f" not in args:
            n = _tail_n(args)
            logs = [f for f in files if LOG_FILE.search(f)]
            if n is not None and n > MAX_TAIL and logs:
                return _deny("no_log_dumps", f"{n} lines of {logs[0]} flood the context; read the tail through "
                             "the progress-bar filter.", f"grep -avE \"it/s|Materializing|Loading weights\" "
                             f"{shlex.quote(logs[0])} | tail -n 50")
    return None


def rule_no_credential_hunting(call: Call) -> Optional[str]:
    if call.tool != "Bash":
        return None
    text = call.command
    home = os.path.expanduser("~")
    for cred in CREDENTIALS:
        tail = cred[2:]
        for form in (cred, "$HOME/" + tail, "${HOME}/" + tail, home + "/" + tail):
            if form in text:
                return _deny("no_credential_hunting", f"{cred} holds someone's credentials: do not read them; if a "
                             "push or download fails with 401, tell the user the token is missing or revoked.", None)
    if re.search(r"\bgit\s+credential(-\w+)?\s+(fill|get)\b", text):
        return _deny("no_credential_hunting", "git credential fill prints stored secrets: tell the user instead.", None)
    try:
        parts = simple_commands(text)
    except ValueError:
        return None
    for i, (words, op) in enumerate(parts):
        _, words = _split_env(words)
        if not words:
            continue
        exe = os.path.basename(words[0])
        shown = []
        if exe in ("echo", "printf"):
            shown = [v for w in words[1:] for v in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", w)]
        elif exe == "printenv":
            shown = words[1:] or (["*"] if op in ("|", "|&") and i + 1 < len(parts)
                                  and SECRET_VAR.search(" ".join(parts[i + 1][0])) else [])
        elif exe in ("env", "set", "export") and len(words) == 1 and op in ("|", "|&") and i + 1 < len(parts):
            shown = ["*"] if SECRET_VAR.search(" ".join(parts[i + 1][0])) else []
        secret = [v for v in shown if v == "*" or SECRET_VAR.search(v)]
        if secret:
            return _deny("no_credential_hunting", "Printing secret variables puts them in the transcript: tell "
                         "the user what is missing instead.", None)
    return None


V4_ARGS = re.compile(r"\b(evaluation_strategy|overwrite_output_dir)\s*=")


def transformers_major() -> Optional[int]:
    from importlib import metadata
    try:
        return int(metadata.version("transformers").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return None


def rule_v5_arguments(call: Call) -> Optional[str]:
    if call.tool not in ("Write", "Edit", "MultiEdit") or not call.path.endswith(".py"):
        return None
    found = sorted(set(V4_ARGS.findall(call.content)))
    if not found or (transformers_major() or 0) < 5:
        return None
    return _deny("v5_arguments", f"{', '.join(found)} were removed in transformers v5 (installed here): "
                 "TrainingArguments raises TypeError.", "write eval_strategy= instead of evaluation_strategy=, "
                 "and drop overwrite_output_dir=")


RULES: dict[str, Callable[[Call], Optional[str]]] = {
    "one_line": rule_one_line, "unbuffered": rule_unbuffered, "quiet_env": rule_quiet_env,
    "notified": rule_notified, "no_log_dumps": rule_no_log_dumps,
    "no_credential_hunting": rule_no_credential_hunting, "v5_arguments": rule_v5_arguments,
}


def decide(call: Call) -> Optional[str]:
    """The first rule that denies, as its reason; None allows."""
    off = {r.strip() for r in call.env.get("SUPERVISE_GUARD_OFF", "").split(",")}
    for name, rule in RULES.items():
        if name not in off:
            reason = rule(call)
            if reason:
                return reason
    return None


def call_from_hook(data: dict, env: dict) -> Call:
    ti = data.get("tool_input") or {}
    tool = data.get("tool_name", "")
    content = ti.get("content") or ti.get("new_string") or ""
    if tool == "MultiEdit":
        content = "\n".join(e.get("new_string", "") for e in ti.get("edits") or [])
    return Call(tool=tool, command=ti.get("command") or "", background=bool(ti.get("run_in_background")),
                cwd=data.get("cwd") or os.getcwd(), env=dict(env), content=content, path=ti.get("file_path") or "")


def main(stdin=None, stdout=None, env=None) -> int:
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    try:
        data = json.loads(stdin.read() or "{}")
        reason = decide(call_from_hook(data, os.environ if env is None else env))
    except Exception as e:  # decide on purpose, never by crashing: allow, and say so
        print(f"supervise guard: allowed without a check ({type(e).__name__}: {str(e)[:120]})", file=sys.stderr)
        return 0
    if reason:
        json.dump({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                          "permissionDecisionReason": reason[:9000]}}, stdout)
    return 0
