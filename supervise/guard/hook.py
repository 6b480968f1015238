"""PreToolUse guards: refuse the launch mistakes that waste a GPU window, before they run.

Each rule is a pure function ``(Call) -> reason | None``; a deny says the rule, the why in a
clause, and the corrected command when one can be derived. A guard decides on purpose, never
by crashing: bad input or an internal error allows the call (and says so on stderr).
``SUPERVISE_GUARD_OFF=rule,rule`` switches rules off. Standard library only: hot path.

Linear time: the command is split once by a regex lexer (``shlex`` is quadratic in the length of
a word), every rule reads the same split, and a command longer than ``MAX_COMMAND`` is decided on
its first ``MAX_COMMAND`` characters, which the reason says. Subshells and ``{ }`` groups are
counted on a stack, not by recursion; a shell's ``-c`` string is split by the same lexer, to
``MAX_NEST`` levels (the level past it is judged by its text alone).
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

from supervise.vocabulary import BUNDLE, PYTHON, QUIET

OWN_SCRIPTS = re.compile(r"(^|/)scripts/(watchdog|checkin|bench|audit|smoke|plot|demo|launch|stop)\.py$")
LAUNCHERS = {"torchrun", "deepspeed"}
SCHEDULERS = {"sbatch"}  # a batch job detaches by design: a launch that needs no run_in_background
LOG_FILE = re.compile(r"(\.log|\.out|\.err|\.txt)$|(^|/)nohup\.out$")
BIG = 256 << 10
MAX_TAIL = 200  # lines of a log that head or tail may print
MAX_TAIL_BYTES = 32 << 10  # bytes of a log that head -c or tail -c may print: about MAX_TAIL lines of 160
CREDENTIALS = ("~/.git-credentials", "~/.netrc", "~/.aws/credentials", "~/.config/gh/hosts.yml",
               "~/.cache/huggingface/token", "~/.huggingface/token", "~/.ssh/id_", "~/.docker/config.json",
               "~/.kaggle/kaggle.json", "~/.config/huggingface/token",
               # gcloud's application-default credentials and its logins' tokens
               "~/.config/gcloud/application_default_credentials.json", "~/.config/gcloud/credentials.db",
               "~/.config/gcloud/access_tokens.db", "~/.config/gcloud/legacy_credentials",
               # the Azure CLI's token caches and service principals' secrets (not azureProfile.json: names, ids)
               "~/.azure/accessTokens.json", "~/.azure/msal_token_cache.json", "~/.azure/msal_token_cache.bin",
               "~/.azure/service_principal_entries.json", "~/.azure/service_principal_entries.bin")
SECRET_VAR = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD", re.I)
OPERATORS = {"&&", "||", ";", "|", "&", "|&", ";;", "(", ")"}
ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
MAX_COMMAND = 256 << 10  # characters of a command the guard reads; past it, it decides on those
MAX_FIX = 8000  # a corrected command longer than this is not shown (hook output is capped at 10,000)


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
    read: int = 0  # the command's full length when only its first MAX_COMMAND characters were read
    memo: dict = field(default_factory=dict, repr=False, compare=False)  # the split, read once per call


# Each operator is one token (&&, ||, ;;, |&, or one of ;&|()), so ``(python train.py &)`` ends in the
# operators & and ), except the & of a redirection (2>&1, >&2, &>log), which stays in its word:
# ``python train.py > log 2>&1`` runs in the foreground.
_RAW_TOKEN = re.compile(r"""&&|\|\||;;|\|&|[;|()]|&(?!>)|(?:[^ \t\r\n;&|()<>'"\\]+|[<>]+&?|&>+|'[^']*'|"[^"\\]*(?:\\.[^"\\]*)*"|\\.)+|['"\\]""", re.S)
_QUOTED_PART = re.compile(r"""'([^']*)'|"([^"\\]*(?:\\.[^"\\]*)*)"|\\(.)|([^'"\\]+)""", re.S)
_DOUBLE_ESCAPE = re.compile(r'\\([\\"])')


def _unquote(word: str) -> str:
    return "".join(m[1] if m[1] is not None else _DOUBLE_ESCAPE.sub(r"\1", m[2]) if m[2] is not None else
                   m[3] if m[3] is not None else m[4] for m in _QUOTED_PART.finditer(word))


def tokens(command: str) -> list[str]:
    """Words and operators as ``shlex.shlex(command, posix=True, punctuation_chars=";&|()")`` with
    ``whitespace_split`` splits them (quotes removed, a quoted part kept in its word), except that
    each operator is its own token (shlex makes one token of a run such as ``&)``) and a
    redirection's ``&`` stays in its word (``2>&1``); in linear time: one regex pass, quotes
    undone only in the words that hold one. ValueError on an unclosed quote or a final backslash."""
    out = _RAW_TOKEN.findall(command)
    for i, t in enumerate(out):
        if "'" in t or '"' in t or "\\" in t:
            if t in ("'", '"', "\\"):  # the lone character no other branch could take
                raise ValueError("No escaped character" if t == "\\" else "No closing quotation")
            out[i] = _unquote(t)
    return out


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


def _items(call: Call) -> Optional[list]:
    """_raw_items of the call's command, split once per call; None when it does not split."""
    if "items" not in call.memo:
        try:
            call.memo["items"] = _raw_items(call.command)
        except ValueError:
            call.memo["items"] = None
    return call.memo["items"]


def _parts(call: Call) -> Optional[list]:
    """simple_commands of the call's command (from the same split as _items); None when it does not split."""
    if "parts" not in call.memo:
        items = _items(call)
        call.memo["parts"] = None if items is None else [([w for _, w in pairs], op) for pairs, op in items if pairs]
    return call.memo["parts"]


def _split_env(words: list[str]) -> tuple[dict, list[str]]:
    """Leading VAR=value assignments (also after ``env``, and inside a ``{ ... }`` group) and the rest."""
    env, i = {}, 0
    while i < len(words) and words[i] == "{":
        i += 1
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
    for wrapper in ("coproc", "nohup", "setsid", "exec", "time", "nice"):
        if rest and rest[0] == wrapper:
            rest = rest[1:]
    if not rest:
        return None
    exe, name = rest[0], os.path.basename(rest[0])
    if PYTHON.match(exe):
        kind = "python"
    elif name in LAUNCHERS:  # torchrun, deepspeed, also as .venv/bin/torchrun: a Python launch
        kind = name
    elif name == "accelerate" and rest[1:2] == ["launch"]:
        kind = "accelerate"
    elif name == "uv" and rest[1:2] == ["run"]:
        kind = "uv"
    else:
        return None
    script = next((w for w in rest[1:] if w.endswith(".py")), "")
    return {"env": env, "argv": rest, "kind": kind, "script": script}


def _own(launch: dict) -> bool:
    s = launch["script"]
    if not s or OWN_SCRIPTS.search(s):
        return bool(s)
    if s not in _OWN:
        try:
            _OWN[s] = Path(s).resolve().is_relative_to(BUNDLE / "scripts")
        except (OSError, ValueError, RuntimeError):  # a path too long or looping: not ours
            _OWN[s] = False
    return _OWN[s]


_OWN: dict = {}  # script path -> is it one of the bundle's scripts (one process decides one call)


def _exported(call: Call) -> dict:
    if "exported" not in call.memo:
        env = {}
        for words, _ in _parts(call) or []:
            if words[0] == "export":
                for w in words[1:]:
                    if ENV_ASSIGN.match(w):
                        k, _, v = w.partition("=")
                        env[k] = v
        call.memo["exported"] = env
    return call.memo["exported"]


def _launches(call: Call) -> list[dict]:
    if "launches" not in call.memo:
        call.memo["launches"] = [x for x in (_launch(w) for w, _ in _parts(call) or []) if x]
    return call.memo["launches"]


def _missing(call: Call, launch: dict) -> list[str]:
    exported = _exported(call)
    return [k for k, v in QUIET.items() if launch["env"].get(k, exported.get(k, call.env.get(k))) != v]


def _buffered(call: Call, launch: dict) -> bool:
    have = {**call.env, **_exported(call), **launch["env"]}
    if have.get("PYTHONUNBUFFERED", "") not in ("", "0"):
        return False
    return not (launch["kind"] == "python" and any(a == "-u" or (a.startswith("-") and not a.startswith("--")
                                                                and "u" in a[1:] and len(a) < 6)
                                                    for a in launch["argv"][1:3]))


def one_line(command: str) -> Optional[str]:
    """The command joined onto one physical line, or None when it cannot be done safely."""
    pieces = command.strip().split("\\\n")  # backslash-newline continuations become one space
    text = " ".join((p if i == 0 else p.lstrip()).rstrip(" \t") if i < len(pieces) - 1 else
                    (p if i == 0 else p.lstrip()) for i, p in enumerate(pieces))
    if "<<" in text:
        return None
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    try:
        for ln in lines:
            tokens(ln)
    except ValueError:  # a quote spans lines: a multi-line -c string
        return None
    out = lines[:1]
    for prev, ln in zip(lines, lines[1:]):
        out.append((" " if prev.endswith(("|", ";", "&")) else " && ") + ln)
    return "".join(out)


def fix_env(call: Call, command: str) -> str:
    """Add -u and the missing quiet variables to each training launch in ``command``, each
    launch's own word in turn (searching on from the last one, so two launches of ``python``
    are each fixed once and the bundle's own scripts are passed over)."""
    sub = Call(call.tool, command, call.background, call.cwd, call.env)
    out, pos = [], 0  # the pieces of the new command; pos: how far ``command`` is copied
    for launch in _launches(sub):
        head = shlex.quote(launch["argv"][0])
        m = re.compile(r"(?<![\w/.=-])" + re.escape(head) + r"(?![\w.])").search(command, pos)
        if m is None:
            continue
        if _own(launch):
            out.append(command[pos:m.end()])
            pos = m.end()
            continue
        buffered = _buffered(sub, launch)
        prefix = " ".join(f"{k}={v}" for k, v in {**({"PYTHONUNBUFFERED": "1"} if buffered else {}),
                                                     **{k: QUIET[k] for k in _missing(sub, launch)}}.items())
        new_head = head + (" -u" if launch["kind"] == "python" and buffered else "")
        out += [command[pos:m.start()], f"{prefix} {new_head}" if prefix else new_head]
        pos = m.end()
    out.append(command[pos:])
    return "".join(out)


def corrected(call: Call) -> Optional[str]:
    """The command fixed (one line, -u, the quiet variables); None when it cannot be derived, or
    when only the command's head was read (a fix of a cut command would run half of it)."""
    if call.read:
        return None
    cmd = one_line(call.command) if "\n" in call.command.strip() else call.command.strip()
    return fix_env(call, cmd) if cmd else None


def _deny(rule: str, why: str, fix: Optional[str]) -> str:
    reason = f"[{rule}] {why}"
    if fix and len(fix) > MAX_FIX:
        return reason + f" (The corrected command is {len(fix):,} characters, too long to show: put the steps in a " \
                        "script file and launch that.)"
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


DETACH = re.compile(r"(^|[\s;&|(])(nohup|setsid|disown|coproc)(\s|$)|screen\s+-d?m")
TMUX_NEW = re.compile(r"tmux\s+new(-session)?\b")
DASH_D = re.compile(r"\s-d")
SYSTEMD_RUN = re.compile(r"(?:^|[\s;&|(/])systemd-run(?=\s)")
# systemd-run's options that take the next word as their value (--unit NAME, -p KEY=VALUE, ...)
SYSTEMD_VALUE_OPTS = {"-p", "--property", "-u", "--unit", "-E", "--setenv", "-M", "--machine", "-H", "--host",
                      "--uid", "--gid", "--nice", "--working-directory", "--description", "--slice", "--service-type",
                      "--on-active", "--on-boot", "--on-startup", "--on-unit-active", "--on-unit-inactive",
                      "--on-calendar", "--timer-property", "--path-property", "--socket-property"}
SYSTEMD_OPTS_READ = 64  # options of one systemd-run read before its command (a bound: linear time)
_SHELL_WORD = re.compile(r"\s*([^\s;&|()]+)")


def _systemd_detaches(text: str, pos: int) -> bool:
    """Does the systemd-run that ends at ``pos`` start its command as a transient service (it runs on
    after the call, outside it) rather than in the caller's own process (``--scope``)?"""
    skip = False
    for _ in range(SYSTEMD_OPTS_READ):
        m = _SHELL_WORD.match(text, pos)
        if m is None:
            return False  # no command: nothing is started
        w, pos = m.group(1).strip("'\""), m.end()
        if skip:
            skip = False
        elif w == "--scope":
            return False
        elif w == "--" or not w.startswith("-"):
            return True
        else:
            skip = w in SYSTEMD_VALUE_OPTS
    return True


def detached(text: str) -> bool:
    """nohup, setsid, disown, coproc, ``screen -dm``, ``systemd-run`` (a transient service; not with
    ``--scope``), or ``tmux new`` with ``-d`` later on the same line; in linear time (one search for
    the first ``tmux new`` of each line, one for a ``-d`` after it; at most SYSTEMD_OPTS_READ words
    after each systemd-run)."""
    if DETACH.search(text):
        return True
    if "systemd-run" in text and any(_systemd_detaches(text, m.end()) for m in SYSTEMD_RUN.finditer(text)):
        return True
    for line in text.split("\n"):
        m = TMUX_NEW.search(line)
        if m and DASH_D.search(line, m.end()):
            return True
    return False


def rule_notified(call: Call) -> Optional[str]:
    if call.tool != "Bash":
        return None
    parts = _parts(call)
    if parts is None:
        return None
    if any(os.path.basename(_split_env(w)[1][0]) in SCHEDULERS for w, _ in parts if _split_env(w)[1]):
        return None  # sbatch: the scheduler runs the job detached by design; the watchdog follows it
    text, items = call.command, _items(call)
    # in the foreground any & detaches; in a background job only a trailing one does (a & b & wait
    # keeps the job, and its notification, until both end); items, not parts: the & of ``(...) &``
    # follows no command
    amp = bool(items) and items[-1][1] == "&" if call.background else any(op == "&" for _, op in items)
    # a launch inside a -c string that TRAINING_TEXT misses is a uv run: the walk looks for one then
    trains = bool(_launches(call)) or bool(TRAINING_TEXT.search(text)) or ("uv" in text and _items_train(items, 0))
    if not ((trains and (amp or detached(text))) or (_nesting(text) and _nested_detach(items, 0))):
        return None
    fix = detach_fix(text, 0, items) if "\n" not in text.strip() and not call.read else None
    where = " (RUN_DIR: the run's folder, for train.log and metrics.jsonl.)" if fix and " RUN_DIR -- " in fix else ""
    how = "" if fix else f" Launch it as {_launcher_form()}."
    return _deny("notified", "A detached launch (&, nohup, setsid, disown, coproc, systemd-run, tmux -d, screen -dm, "
                 "in bash -c, eval or ( ) too) leaves no launch record and never wakes you: start the trainer with "
                 "the launcher (it detaches and records it), then run the watchdog line it prints with "
                 "run_in_background: true." + where + how, fix)


def _launcher_form() -> str:
    from supervise.act.launch import launcher_line  # the deny path only: the hook's hot path stays small
    return launcher_line("RUN_DIR", "TRAINING_COMMAND")


# ----------------------------------------------------------------------------- shells' -c strings and subshells
MAX_NEST = 3  # levels of bash -c strings read; the one past it is judged by its text alone (a bounded recursion)
SHELLS = {"bash", "sh", "zsh", "dash", "ksh", "ash"}
SHELL_ARG_OPTS = {"-o", "+o", "-O", "+O", "--rcfile", "--init-file"}  # a shell's options that take a value
PREFIXES = {"nohup", "setsid", "exec", "time", "nice", "command", "coproc"}  # words that run the command after them
ENV_ARG_OPTS = {"-u", "--unset", "-C", "--chdir"}
TRAINING_TEXT = re.compile(r"python\d*(\.\d+)?\s|torchrun|accelerate\s+launch|deepspeed")
LONE_AMP = re.compile(r"(?<![&>|])&(?![&>])")  # an & that puts a command in the background (not &&, 2>&1, &>, |&)
# what a subshell, a { } group or a shell's -c string needs in the text (a cheap test before the walk)
NESTING_TEXT = re.compile(r"""[({]|(?:^|[\s/;&|'"])(?:ba|z|da|k|a)?sh['"]?\s|(?:^|[\s;&|])eval\s""")


def _nesting(text: str) -> bool:
    """Might ``text`` hold a subshell, a { } group or a shell's -c string (or eval's string): NESTING_TEXT,
    searched only when the plain substring tests (fast) leave it open."""
    return "(" in text or "{" in text or (("sh" in text or "eval" in text) and bool(NESTING_TEXT.search(text)))


def _shell_c(pairs: list) -> Optional[tuple[int, int]]:
    """(where the shell's word is, where its -c string is) when this simple command runs a shell's
    -c string: ``bash -c STRING``, also sh, zsh, dash, ksh by any path, after VAR=value, env, nohup,
    setsid, exec, time, nice, with -c among other options (``-lc``, ``--login -c``); also ``eval WORDS``
    (this shell runs its words joined as a command: read like a -c string, see c_string); else None."""
    for _, first in pairs:
        if first != "{":
            break
    else:
        return None
    if not (first in PREFIXES or first in ("env", "eval") or first.rpartition("/")[2] in SHELLS
            or ENV_ASSIGN.match(first)):
        return None  # the common case, decided on one word
    words = [w for _, w in pairs]
    i, n = 0, len(words)
    while i < n and words[i] == "{":
        i += 1
    while i < n:
        w = words[i]
        if ENV_ASSIGN.match(w):
            i += 1
        elif w == "env" or w in PREFIXES:
            i += 1
            while i < n and words[i].startswith("-") and words[i] != "-":
                i += 2 if w == "env" and words[i] in ENV_ARG_OPTS else 1
        else:
            break
    if i + 1 < n and words[i] == "eval":  # eval 'python train.py &': the words after it (c_string joins them)
        return i, i + 1
    if i >= n or os.path.basename(words[i]) not in SHELLS:
        return None
    j, c = i + 1, False
    while j < n:
        w = words[j]
        if w == "--":
            j += 1
            break
        if w in SHELL_ARG_OPTS:
            j += 2
        elif w.startswith("--"):
            j += 1
        elif len(w) > 1 and w[0] in "-+" and w[1:].isalpha():
            c = c or (w[0] == "-" and "c" in w)
            j += 1
        else:
            break
    return (i, j) if c and j < n else None


def c_string(pairs: list, sc: tuple[int, int]) -> str:
    """The command text that _shell_c's simple command runs: its shell's -c string, or the words eval
    joins with blanks (``eval python train.py '&'`` runs ``python train.py &``), redirections left out."""
    i, j = sc
    if pairs[i][1] != "eval":
        return pairs[j][1]
    words, skip = [], False
    for raw, word in pairs[j:]:
        m = None if skip else REDIRECT.match(raw)
        if skip or m:
            skip = bool(m) and m.group(1) == ""
            continue
        words.append(word)
    return " ".join(words)


def _unbrace(pairs: list) -> tuple[int, list]:
    """How many ``{`` open this simple command, and its words after them."""
    n = 0
    while n < len(pairs) and pairs[n][1] == "{":
        n += 1
    return n, pairs[n:]


def _trains(command: str, depth: int = 0) -> bool:
    """Does ``command`` start a training launch (not one of the bundle's own scripts), also in a
    tmux or screen command's string or a shell's -c string; past MAX_NEST levels, judged by its text."""
    if depth > MAX_NEST:
        return bool(TRAINING_TEXT.search(command))
    try:
        return _items_train(_raw_items(command), depth)
    except ValueError:
        return False


def _items_train(items: Optional[list], depth: int) -> bool:
    for pairs, _ in items or []:
        pairs = _unbrace(pairs)[1]
        if not pairs:
            continue
        if _launch_at(pairs):
            return True
        sc = _shell_c(pairs)
        if sc and _trains(c_string(pairs, sc), depth + 1):
            return True
        words = _split_env([w for _, w in pairs])[1]
        if words and os.path.basename(words[0]) in MULTIPLEXERS and \
                any(" " in w and _trains(w, depth + 1) for _, w in pairs[1:]):
            return True
    return False


def _nested_detach(items: Optional[list], depth: int) -> bool:
    """True when a training launch inside a ``( ... )`` subshell, a ``{ ... }`` group or a shell's -c
    string is left running detached: its and-or list ends in ``&`` and no ``wait`` follows in the
    same group or string (the group, or the shell, ends and leaves it running); or, in a -c string,
    it runs under nohup, setsid, disown, tmux -d or screen -dm. The top level of the command itself
    is rule_notified's (depth 0). Groups are counted on a stack, not by recursion; -c strings are
    read to MAX_NEST levels, the one past it judged by its text. Linear in the command's length."""
    # per open group: [it ends (a group, or a -c string's own level), a training & pending, it trains, the
    # and-or list outside it trains]
    stack = [[depth > 0, False, False, False]]
    trains = False  # the and-or list being read trains
    for pairs, op in items or []:
        if pairs and pairs[0][1] == "}" and len(stack) > 1:
            frame = stack.pop()
            if frame[1]:
                return True
            trains = frame[3] or frame[2]
            stack[-1][2] = stack[-1][2] or frame[2]
            pairs = pairs[1:]
        n, pairs = _unbrace(pairs)
        for _ in range(n):
            stack.append([True, False, False, trains])
            trains = False
        if pairs:
            if pairs[0][1] == "wait":
                stack[-1][1] = False
            sc, here = _shell_c(pairs), False
            if sc is not None:
                inner = c_string(pairs, sc)
                if depth >= MAX_NEST:
                    here = bool(TRAINING_TEXT.search(inner))
                    if here and (detached(inner) or LONE_AMP.search(inner)):
                        return True
                else:
                    try:
                        sub = _raw_items(inner)
                    except ValueError:  # an unclosed quote: the shell refuses to run it
                        sub = None
                    if sub is not None:
                        if _nested_detach(sub, depth + 1):
                            return True
                        here = _items_train(sub, depth + 1)
                        if here and detached(inner):
                            return True
            elif stack[-1][0]:
                here = _launch_at(pairs) is not None
            if here:
                trains = stack[-1][2] = True
        if op == "(":
            stack.append([True, False, False, trains])
            trains = False
        elif op == ")" and len(stack) > 1:
            frame = stack.pop()
            if frame[1]:
                return True
            trains = frame[3] or frame[2]
            stack[-1][2] = stack[-1][2] or frame[2]
        elif op == "&":
            if trains and stack[-1][0]:
                stack[-1][1] = True
            trains = False
        elif op in (";", ";;"):
            trains = False
    return any(f[0] and f[1] for f in stack)


def _detaches(command: str) -> bool:
    """Would rule_notified still refuse ``command`` run in the foreground (a fix must not)."""
    nesting = _nesting(command)
    if not (nesting or LONE_AMP.search(command) or detached(command)):
        return False
    try:
        items = _raw_items(command)
    except ValueError:
        return False
    amp = any(op == "&" for _, op in items)
    return ((amp or detached(command)) and (bool(TRAINING_TEXT.search(command)) or _items_train(items, 0))) \
        or bool(nesting and _nested_detach(items, 0))


# ----------------------------------------------------------------------------- the launcher's line as the fix
WRAPPERS = {"nohup", "setsid", "coproc"}  # dropped: the launcher detaches the command itself
MULTIPLEXERS = {"tmux", "screen"}      # the training command is found inside their arguments
SERVICE_RUNNERS = {"systemd-run"}      # ... and among these' words (a unit of its own: dropped as well)
LAUNCH_WINDOW = 16  # words read after a multiplexer's or service runner's word to tell a launch's start
OUT_FLAGS = ("--out", "--output_dir", "--output-dir", "--out-dir", "--out_dir", "--run-dir", "--run_dir")
LAUNCHER_ENV = {"PYTHONUNBUFFERED", *QUIET}  # the launcher sets these itself
REDIRECT = re.compile(r"^(?:\d*|&)(?:>>?|<)&?(.*)$")


def _raw_items(command: str) -> list[tuple[list[tuple[str, str]], str]]:
    """Each simple command with each word's raw text (its quoting kept) beside its value, and the
    operator that follows it: [([(raw, word), ...], operator)]; an operator that follows no command
    (a subshell's ``(``, the ``&&`` after a ``)``) comes as ([], operator). ValueError as ``tokens``."""
    out, cur = [], []
    for raw in _RAW_TOKEN.findall(command):
        if raw in OPERATORS:
            out.append((cur, raw))
            cur = []
        elif "'" in raw or '"' in raw or "\\" in raw:
            if raw in ("'", '"', "\\"):  # the lone character no other branch could take
                raise ValueError("unbalanced quoting")
            cur.append((raw, _unquote(raw)))
        else:
            cur.append((raw, raw))
    if cur:
        out.append((cur, ""))
    return out


def _launch_at(pairs: list) -> Optional[tuple[list[str], list]]:
    """(the raw VAR=value words to keep, the (raw, word) pairs of the training command with its
    wrappers and redirections dropped) when this simple command is a detached training launch
    (also among a tmux or screen command's words); None when it is none, or one of the bundle's
    own scripts (kept as it is)."""
    i, env = 0, []
    while i < len(pairs) and (ENV_ASSIGN.match(pairs[i][1]) or pairs[i][1] == "env"):
        if pairs[i][1] != "env" and pairs[i][1].partition("=")[0] not in LAUNCHER_ENV:
            env.append(pairs[i][0])
        i += 1
    while i < len(pairs) and os.path.basename(pairs[i][1]) in WRAPPERS:
        i += 1
        while i < len(pairs) and pairs[i][1].startswith("-"):
            i += 1
    rest = pairs[i:]
    head = os.path.basename(rest[0][1]) if rest else ""
    if head in MULTIPLEXERS or head in SERVICE_RUNNERS:  # tmux new -d -s t python train.py, systemd-run --user ...
        # where the launch starts, judged on a window of words after each candidate (linear time: a list of
        # all the words after each one would make 20,000 words of ``systemd-run`` take seconds)
        k = next((k for k in range(1, len(rest)) if not rest[k][1].startswith("-") and not
                  (head in SERVICE_RUNNERS and ENV_ASSIGN.match(rest[k][1])) and
                  _launch([w for _, w in rest[k:k + LAUNCH_WINDOW]])), None)
        return _launch_at(rest[k:]) if k else None
    found = _launch([w for _, w in rest])
    if not found or _own(found):
        return None
    cmd, skip = [], False
    for raw, word in rest:
        if skip:
            skip = False
            continue
        m = REDIRECT.match(raw)
        if m:  # the launcher owns the output: it appends to RUN_DIR/train.log
            skip = m.group(1) == ""
            continue
        cmd.append((raw, word))
    return env, cmd


def _run_dir_of(pairs: list, command: str) -> str:
    """The run folder a training command names: --out and its spellings, else the folder of the
    train.log its output went to; else the placeholder RUN_DIR."""
    words = [w for _, w in pairs]
    for i, w in enumerate(words):
        flag, eq, value = w.partition("=")
        if flag in OUT_FLAGS and (eq or i + 1 < len(words)):
            # the word as it was written, so that its $VAR (and, as a word of its own, its ~) expands as
            # it did; quoted again, it would not (a ~ after --out= is not expanded: quoted, as it was)
            raw = pairs[i][0].partition("=")[2] if eq and pairs[i][0].startswith(flag + "=") else \
                None if eq else pairs[i + 1][0]
            ok = raw and not REDIRECT.match(raw) and not (eq and raw.startswith("~"))
            return raw if ok else shlex.quote(value if eq else words[i + 1])
    for m in re.finditer(r"(?:^|\s)\d*>>?\s*(\S*train\.log)(?=\s|$)", command):
        target = os.path.dirname(_unquote(m.group(1)))
        if target:
            return shlex.quote(target)
    return "RUN_DIR"


SEPARATORS = {"&&", "||", ";", "|", "&", "|&", ";;"}
SUBSTITUTION = re.compile(r"[$<>]\(|\(\(")  # $( ), <( ), >( ), (( )): not subshells a fix may rebuild


def detach_fix(command: str, _depth: int = 0, _split: Optional[list] = None) -> Optional[str]:
    """``command`` with each detached training launch started by the launcher instead (its
    nohup, setsid, tmux or screen, its output redirection and its ``&`` dropped; VAR=value words
    other than the ones the launcher sets kept in front), also inside a shell's -c string (the shell
    and its options kept, the string fixed and quoted again) and in ``( )`` or ``{ }`` groups (kept),
    ``disown`` and the ``&`` that ended a launch dropped, the other steps kept. None when it cannot
    be derived (also for a command substitution, or past MAX_NEST levels of -c strings). ``_split``:
    ``_raw_items(command)`` when the caller has it."""
    from supervise.act.launch import launcher_line  # the deny path only: the hook's hot path stays small
    if _depth > MAX_NEST or SUBSTITUTION.search(command):
        return None
    try:
        items = _raw_items(command) if _split is None else _split
    except ValueError:
        return None
    seq: list = []  # the fixed command: ("c", a simple command's text) and ("o", an operator)
    piped = False   # the pipe after a launch (| tee log) is output capture: the launcher does it
    for pairs, op in items:
        if pairs and piped:
            piped = op in ("|", "|&")
            if op and not piped:
                seq.append(("o", op))
            continue
        if pairs:
            done = _fix_one(pairs, _depth, launcher_line)
            if done is None:
                return None
            text, launched = done
            if text:
                seq.append(("c", text))
            if launched and op in ("|", "|&"):
                piped = True
                continue
        if op:
            seq.append(("o", op))
    text = _join(seq)
    return None if not text or detached(text) or _detaches(text) else text


def _fix_one(pairs: list, depth: int, launcher_line: Callable) -> Optional[tuple[str, bool]]:
    """(this simple command fixed, whether it became a launcher line); ("", False) drops it (disown);
    None when it cannot be fixed."""
    n, pairs = _unbrace(pairs)
    brace = "{ " * n
    if not pairs:
        return brace.strip(), False
    words = _split_env([w for _, w in pairs])[1]
    head = os.path.basename(words[0]) if words else ""
    if head == "disown":
        return brace.strip(), False
    found = _launch_at(pairs)
    if found is not None:
        env, cmd = found
        if not cmd:
            return None
        line = launcher_line(_run_dir_of(cmd, " ".join(r for r, _ in pairs)), " ".join(r for r, _ in cmd))
        return brace + " ".join([*env, line]), True
    sc = _shell_c(pairs)
    if sc is not None and _trains(c_string(pairs, sc), depth + 1):
        if pairs[sc[0]][1] == "eval" and c_string(pairs, sc) != pairs[sc[1]][1]:
            return None  # eval of several words: no one word to put the fixed string in
        inner = detach_fix(pairs[sc[1]][1], depth + 1)  # bash -c 'cd x && python train.py &': its own chain
        if inner is None:
            return None
        kept, dropping = [], False
        for raw, word in pairs[:sc[0]]:  # nohup, setsid (and their options) before the shell go
            if word in WRAPPERS:
                dropping = True
            elif not (dropping and word.startswith("-")):
                dropping = False
                kept.append(raw)
        kept += [r for r, _ in pairs[sc[0]:sc[1]]] + [_requote(inner, pairs[sc[1]][0])]
        skip = False
        for raw, _ in pairs[sc[1] + 1:]:  # $0 and the arguments stay; the output redirections go (the
            if skip:                      # launcher prints the watchdog line to run next)
                skip = False
                continue
            m = REDIRECT.match(raw)
            if m:
                skip = m.group(1) == ""
                continue
            kept.append(raw)
        return brace + " ".join(kept), False
    inner = next((w for _, w in pairs[1:] if " " in w and _trains(w, depth + 1)), None) \
        if head in MULTIPLEXERS else None
    if inner is not None:
        text = detach_fix(inner, depth + 1)  # tmux new -d 'cd /w && python train.py > log 2>&1': its own chain
        return None if text is None else (brace + text, False)
    return brace + " ".join(r for r, w in pairs if w not in WRAPPERS), False


def _requote(text: str, raw: str) -> str:
    """``text`` as one shell word, in the quotes ``raw`` had when that keeps its meaning (double
    quotes keep a $VAR expanding in the outer shell, as it did), else as shlex.quote quotes it."""
    body = raw[1:-1]
    if len(raw) > 1 and raw[0] == raw[-1] == '"' and not any(c in body for c in '"\\') \
            and not any(c in text for c in '"\\`'):
        return f'"{text}"'
    if len(raw) > 1 and raw[0] == raw[-1] == "'" and "'" not in body and "'" not in text:
        return f"'{text}'"
    return shlex.quote(text)


def _join(seq: list) -> str:
    """The fixed command's text: a separator with nothing to join on one side is dropped (the & of
    a launch before a ``)`` or the end), the & of a launch becomes && (the launcher returns at once),
    or ; before a ``}``."""
    out: list = []
    for k, (kind, x) in enumerate(seq):
        if kind == "o" and x in SEPARATORS:
            nxt = seq[k + 1] if k + 1 < len(seq) else None
            if not out or out[-1] == ("o", "(") or (out[-1][0] == "o" and out[-1][1] in SEPARATORS) or nxt is None \
                    or nxt == ("o", ")") or (nxt[0] == "o" and nxt[1] in SEPARATORS):
                continue
            if x == "&":
                x = ";" if nxt[0] == "c" and nxt[1].startswith("}") else "&&"
        out.append((kind, x))
    text: list = []  # pieces; a separator's trailing blank is its own piece, so a ) can take its place
    for kind, x in out:
        last = text[-1] if text else ""
        if kind == "c":
            text += [x] if not text or last == " " or last.endswith("(") else [" ", x]
        elif x == "(":
            text.append(" (" if last.endswith("(") else "(")  # never ((: that is arithmetic
        elif x == ")":
            text[-1:] = [")"] if last == " " else [last, ")"]
        else:
            text += [";" if x == ";" else f" {x}", " "]
    return "".join(text).strip()


def _size(call: Call, path: str) -> int:
    p = Path(os.path.expanduser(path))
    p = p if p.is_absolute() else Path(call.cwd) / p
    try:
        return p.stat().st_size
    except OSError:
        return -1


# the multipliers GNU head and tail accept after a count (-c 10M, -n 1K)
COUNT_SUFFIX = {"": 1, "b": 512, "K": 1024, "KiB": 1024, "kB": 1000, "KB": 1000, "M": 1 << 20, "MiB": 1 << 20,
                "MB": 10 ** 6, "G": 1 << 30, "GiB": 1 << 30, "GB": 10 ** 9}
COUNT = re.compile(r"^([+-]?)(\d+)([A-Za-z]*)$")
OLD_COUNT = re.compile(r"^-\d+$")  # tail -1000, head -300: the old form of -n


def head_tail_count(args: list[str], short: str, long: str) -> Optional[tuple[str, int]]:
    """(its sign, its value) of head's or tail's count option in ``args``: ``short`` "n" and ``long``
    "--lines" for lines (also the old form -1000), "c" and "--bytes" for bytes, as -n 5, -n5, --lines=5,
    --lines 5, with a sign (+N: tail from the Nth on; -N: head all but the last N) and a multiplier
    (10M, 1K); None when it is not given or cannot be read."""
    for i, a in enumerate(args):
        if a in ("-" + short, long):
            value = args[i + 1] if i + 1 < len(args) else ""
        elif a.startswith("-" + short) and len(a) > 2:
            value = a[2:]
        elif a.startswith(long + "="):
            value = a[len(long) + 1:]
        elif short == "n" and OLD_COUNT.match(a):
            value = a[1:]
        else:
            continue
        m = COUNT.match(value)
        return (m[1], int(m[2]) * COUNT_SUFFIX[m[3]]) if m and m[3] in COUNT_SUFFIX else None
    return None


def _checkin_fix(path: str) -> str:
    """What to run instead of dumping the log ``path``: check-in of its folder, or its filtered tail."""
    return ("python " + str(BUNDLE / "scripts" / "checkin.py") + f" {shlex.quote(os.path.dirname(path) or '.')} (or "
            f"tail -n 20 metrics.jsonl, or grep -avE \"it/s|Materializing|Loading weights\" {shlex.quote(path)} | "
            "tail -n 50)")


def _head_tail_dump(call: Call, exe: str, args: list[str], log: str) -> Optional[str]:
    """The deny reason when ``exe`` (head or tail) prints more of the log ``log`` than the context can
    take: more than MAX_TAIL lines, more than MAX_TAIL_BYTES bytes, or all of it from a line or byte on
    (tail -n +1, tail -c +1, head -n -5), unless the file is known to be no bigger than MAX_TAIL_BYTES."""
    lines, nbytes = head_tail_count(args, "n", "--lines"), head_tail_count(args, "c", "--bytes")
    count, unit = (nbytes, "byte") if nbytes else (lines, "line")
    if count is None:
        return None
    sign, n = count
    to_the_end = sign == ("+" if exe == "tail" else "-")  # tail from the Nth on; head all but the last N
    if not to_the_end and n <= (MAX_TAIL_BYTES if unit == "byte" else MAX_TAIL):
        return None
    size = _size(call, log)
    if 0 <= size <= MAX_TAIL_BYTES:
        return None  # a small file: all of it is a short read
    of = f" ({size // 1024:,} KiB)" if size > 0 else ""
    if to_the_end:
        flag = f"{exe} {'-c' if unit == 'byte' else '-n'} {sign}{n}"
        what = (f"{flag} prints {log}{of} from {unit} {n} to its end" if exe == "tail" else
                f"{flag} prints all of {log}{of} but its last {n} {unit}s")
        return _deny("no_log_dumps", f"{what}: dumping it floods the context.", _checkin_fix(log))
    if unit == "byte":
        return _deny("no_log_dumps", f"{n:,} bytes of {log} flood the context (the bound is "
                     f"{MAX_TAIL_BYTES >> 10} KiB, about {MAX_TAIL} lines).", _checkin_fix(log))
    return _deny("no_log_dumps", f"{n} lines of {log} flood the context; read the tail through the progress-bar "
                 "filter.", f"grep -avE \"it/s|Materializing|Loading weights\" {shlex.quote(log)} | tail -n 50")


def rule_no_log_dumps(call: Call) -> Optional[str]:
    if call.tool != "Bash":
        return None
    for words, op in _parts(call) or []:
        if op in ("|", "|&"):
            continue  # its output is filtered further down the pipe
        _, words = _split_env(words)
        if not words:
            continue
        exe = os.path.basename(words[0])
        if exe not in ("cat", "less", "more", "bat", "head", "tail"):
            continue
        args = words[1:]
        files = [a for a in args if not a.startswith("-") and not a.lstrip("+").isdigit()]
        if exe in ("cat", "less", "more", "bat"):
            big = [f for f in files if _size(call, f) > BIG]
            if big:
                return _deny("no_log_dumps", f"{big[0]} is {_size(call, big[0]) // 1024} KiB: dumping it floods "
                             "the context.", _checkin_fix(big[0]))
        if exe in ("head", "tail") and "-f" not in args:
            logs = [f for f in files if LOG_FILE.search(f)]
            reason = _head_tail_dump(call, exe, args, logs[0]) if logs else None
            if reason:
                return reason
    return None


# ----------------------------------------------------------------------------- dotenv files, cloud tokens
# A dotenv file: .env or .env.<something> (.env.local, config/.env.production). Its templates hold no
# secrets (they are committed to be copied): .env.example, .env.sample, .env.template ... are not one.
DOTENV_TEMPLATES = {"example", "sample", "template", "dist", "defaults", "tmpl", "tpl"}
READERS = {"cat", "tac", "nl", "less", "more", "most", "bat", "batcat", "head", "tail", "grep", "egrep", "fgrep",
           "rg", "ag", "sed", "awk", "gawk", "mawk", "cut", "sort", "uniq", "strings", "xxd", "od", "hexdump",
           "base64", "base32", "diff", "jq", "column", "paste", "fold", "tar", "zip"}  # print or pack a file
COPIERS = {"cp", "scp", "rsync", "install"}  # all but the last path are read (cp .env.example .env writes one)
PROGRAM_FIRST = {"grep", "egrep", "fgrep", "rg", "ag", "sed", "awk", "gawk", "mawk", "jq"}  # 1st word: the pattern
PROGRAM_FLAGS = ("-e", "-f", "--regexp", "--file", "--expression")  # ... unless given by a flag
# commands that run the command after them: {name: (their options that take the next word as a value, how many
# plain words come before the command: timeout's duration, taskset's CPU mask)}
RUNNERS = {
    "sudo": ({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "--user", "--group", "--chdir", "--prompt",
              "--role", "--type", "--other-user", "--host", "--close-from", "--command-timeout"}, 0),
    "doas": ({"-u", "-C"}, 0), "env": ({"-u", "--unset", "-C", "--chdir"}, 0), "nice": ({"-n", "--adjustment"}, 0),
    "timeout": ({"-s", "--signal", "-k", "--kill-after"}, 1), "stdbuf": ({"-i", "-o", "-e"}, 0),
    "ionice": ({"-c", "-n", "--class", "--classdata"}, 0), "taskset": (set(), 1), "time": ({"-f", "-o"}, 0),
    "watch": ({"-n", "--interval"}, 0), "xargs": ({"-I", "-n", "-P", "-d", "-L", "-s", "-E", "-a"}, 0),
    "command": (set(), 0), "exec": ({"-a"}, 0), "nohup": (set(), 0), "setsid": (set(), 0),
}
# git commands that print a file's content (git diff .env, git show HEAD:.env, git log -p -- .env), and the
# flags that make them print names or counts instead (unless a patch is asked for too)
_NAMES_ONLY = {"--stat", "--numstat", "--shortstat", "--name-only", "--name-status", "--summary", "--dirstat",
               "--quiet", "--no-patch", "-s"}
GIT_PRINTS = {"diff": _NAMES_ONLY, "show": _NAMES_ONLY, "format-patch": _NAMES_ONLY, "log": set(),
              "whatchanged": set(), "blame": set(), "annotate": set(), "cat-file": {"-t", "-s", "-e"},
              "grep": {"-q", "--quiet", "-l", "-L", "-c", "--count", "--name-only", "--files-with-matches",
                       "--files-without-match"}}
GIT_PATCH = re.compile(r"^(-p|-u|--patch(-with-stat|-with-raw)?|-U\d*|--unified(=.*)?)$")
GIT_OWN_VALUE_OPTS = {"-C", "-c", "--git-dir", "--work-tree", "--namespace"}
CLOUD_TOKEN_VERBS = {"gcloud": {"print-access-token", "print-identity-token", "print-refresh-token", "config-helper"},
                     "az": {"get-access-token"}}
DOTENV_LITERAL = re.compile(r"""['"]([^'"\s]*)['"]""")
CLOUD_KEY_VAR = re.compile(r"\$\{?GOOGLE_APPLICATION_CREDENTIALS\b")  # the path of a service account's key


def is_dotenv(word: str) -> bool:
    """Is ``word`` the path of a dotenv file (.env, .env.local, config/.env, ~/proj/.env.production,
    a glob .env*), not a template (.env.example, .env.sample, .env.template) or a look-alike (.envrc)."""
    name = word.rstrip("/").rpartition("/")[2]
    if name == ".env":
        return True
    if name.startswith(".env."):
        return name.rpartition(".")[2].lower() not in DOTENV_TEMPLATES
    return name.startswith(".env") and name[4:5] in ("*", "?", "[")


def _read_files(exe: str, args: list[str]) -> list[str]:
    """The paths a reading or copying command reads: its words, less its options, the pattern or
    program of grep, sed and awk, output redirections' targets, and a copy's destination; an input
    redirection's target is read; curl's @file, -T file and file:// URL, wget's --post-file= are
    reads too."""
    out, plain, i = [], [], 0
    while i < len(args):
        a = args[i]
        m = REDIRECT.match(a)
        if m:  # > .env writes it; < .env reads it
            target = m.group(1) or (args[i + 1] if i + 1 < len(args) else "")
            if ">" not in a[:len(a) - len(m.group(1))]:
                out.append(target)
            i += 1 if m.group(1) else 2
            continue
        if exe in ("curl", "wget"):
            if a.startswith("file://"):  # curl file:///srv/app/.env prints it
                out.append(a[7:])
            elif "@" in a:
                out.append(a.partition("@")[2].split(";")[0])
            elif a in ("-T", "--upload-file") and i + 1 < len(args):
                out.append(args[i + 1])
            elif a.startswith(("--post-file=", "--body-file=")):
                out.append(a.partition("=")[2])
        elif a.startswith("-"):
            if "=" in a:
                out.append(a.partition("=")[2])  # --file=.env
        else:
            plain.append(a)
        i += 1
    if exe in PROGRAM_FIRST and plain and not any(a.startswith(PROGRAM_FLAGS) for a in args):
        plain = plain[1:]
    if exe in COPIERS:
        plain = plain[:-1]
    return out + plain if exe not in ("curl", "wget") else out


def unwrap(words: list[str]) -> list[str]:
    """The command a simple command runs: its leading ``{``, VAR=value words and runners stripped
    (sudo -u root, doas, env -i VAR=1, nice -n 5, timeout 5, stdbuf -oL, xargs, ...: each with its
    options, their values, its VAR=value words and its plain words before the command); a runner
    with no command after it is the command (``env`` alone prints the environment)."""
    i = 0
    while i < len(words) and (words[i] == "{" or ENV_ASSIGN.match(words[i])):
        i += 1
    words = words[i:]
    while words:
        spec = RUNNERS.get(os.path.basename(words[0]))
        if spec is None:
            break
        takes, plain = spec
        i = 1
        while i < len(words) and words[i].startswith("-") and words[i] != "-":
            if words[i] == "--":
                i += 1
                break
            i += 2 if words[i] in takes else 1
        while i < len(words) and ENV_ASSIGN.match(words[i]):  # sudo VAR=1 CMD, env VAR=1 CMD
            i += 1
        i += plain
        if i >= len(words):
            break
        words = words[i:]
    return words


def _git_shown(args: list[str]) -> list[str]:
    """The paths whose content this git command prints (git diff .env, git show HEAD:.env, git log -p
    -- .env, git blame .env, git cat-file -p HEAD:.env, git grep KEY -- .env); [] when it prints only
    names or counts (--stat, --name-only, -q), or is no command that prints a file."""
    i = 0
    while i < len(args) and args[i].startswith("-"):  # git -C DIR --no-pager diff ...
        i += 2 if args[i] in GIT_OWN_VALUE_OPTS else 1
    if i >= len(args) or args[i] not in GIT_PRINTS:
        return []
    verb, rest = args[i], args[i + 1:]
    patch = any(GIT_PATCH.match(a) for a in rest)
    if not patch and (verb in ("log", "whatchanged") or any(a.partition("=")[0] in GIT_PRINTS[verb] for a in rest)):
        return []  # git log .env lists commits; git diff --stat .env counts lines
    plain = [a for a in rest if not a.startswith("-")]
    if verb == "grep" and not any(a.startswith(("-e", "-f")) for a in rest):
        plain = plain[1:]  # the pattern
    return [a.partition(":")[2] if ":" in a else a for a in plain]


def _secret_read(words: list[str]) -> Optional[str]:
    """The deny reason when this simple command prints or copies a dotenv file, a cloud key's file
    (``$GOOGLE_APPLICATION_CREDENTIALS``), or asks a cloud CLI for a live token, also through a runner
    (sudo -u root cat .env) and git (git diff .env); else None."""
    words = unwrap(words)
    if not words:
        return None
    exe, args = os.path.basename(words[0]), words[1:]
    verbs = CLOUD_TOKEN_VERBS.get(exe)
    if verbs and any(a in verbs for a in args):
        verb = next(a for a in args if a in verbs)
        return (f"{exe} {verb} prints a live access token into the transcript: do not; if a call fails with 401, "
                "tell the user the login is missing or expired.")
    files: list[str] = []
    if exe == "git":
        files = _git_shown(args)
    elif exe in READERS or exe in COPIERS or exe in ("curl", "wget"):
        if exe == "sed" and any(a.startswith(("-i", "--in-place")) for a in args):
            return None  # edits it in place: nothing is printed
        if exe in ("grep", "egrep", "fgrep", "rg") and any(a in ("-q", "--quiet", "--silent") or
                                                           (a[:1] == "-" and a[1:2] != "-" and "q" in a) for a in args):
            return None  # grep -q KEY .env: is it set? nothing is printed
        files = _read_files(exe, args)
    elif PYTHON.match(words[0]) and "-c" in args[:-1]:  # python -c "print(open('.env').read())"
        code = args[args.index("-c") + 1]
        reads = "open(" in code or "read_" in code or "dotenv_values" in code
        files = DOTENV_LITERAL.findall(code) if reads else []
    elif exe == "dotenv" or (PYTHON.match(words[0]) and args[:2] == ["-m", "dotenv"]):
        verb = next((a for a in args if a in ("list", "get", "run", "set", "unset")), "")
        if verb in ("list", "get"):  # dotenv run -- CMD is a use: it passes the values on, unprinted
            return (f"dotenv {verb} prints the values of a dotenv file, which holds someone's credentials: do not; "
                    "if a push or download fails with 401, tell the user the token is missing or revoked.")
    for f in files:
        if is_dotenv(f):
            source = _source_word(f if "/" in f else "./" + f)  # . FILE without a / searches PATH first
            return (f"{f} is a dotenv file: it holds someone's credentials: do not read or copy it (to pass it to "
                    f"a program: set -a && . {source} && set +a && COMMAND, or docker's --env-file); if a push or "
                    "download fails with 401, tell the user the token is missing or revoked.")
        if CLOUD_KEY_VAR.match(f):
            return ("$GOOGLE_APPLICATION_CREDENTIALS names a service account's key: do not read it; if a call fails "
                    "with 401, tell the user the key is missing or revoked.")
    return None


HOME_FORMS = ("~/", "$HOME/", "${HOME}/")


def _source_word(path: str) -> str:
    """``path`` as a shell word that names the same file: quoted, but its leading ~/ or $HOME/ left bare
    (quoted, they would not expand)."""
    home = next((h for h in HOME_FORMS if path.startswith(h)), "")
    return home + shlex.quote(path[len(home):]) if home and len(path) > len(home) else shlex.quote(path)


def rule_no_credential_hunting(call: Call) -> Optional[str]:
    if call.tool != "Bash":
        return None
    text = call.command
    home = call.env.get("HOME") or os.path.expanduser("~")
    for cred in CREDENTIALS:
        tail = cred[2:]
        for form in (cred, "$HOME/" + tail, "${HOME}/" + tail, home + "/" + tail):
            if form in text:
                return _deny("no_credential_hunting", f"{cred} holds someone's credentials: do not read them; if a "
                             "push or download fails with 401, tell the user the token is missing or revoked.", None)
    if re.search(r"\bgit\s+credential(-\w+)?\s+(fill|get)\b", text):
        return _deny("no_credential_hunting", "git credential fill prints stored secrets: tell the user instead.", None)
    secret = _secret_in(_parts(call) or [])
    if secret is None and _nesting(text):  # bash -c 'cat .env', bash -c 'echo $HF_TOKEN', eval 'cat .env'
        secret = _secret_inside(_items(call), 0)
    return _deny("no_credential_hunting", secret, None) if secret else None


def _secret_in(parts: list[tuple[list[str], str]]) -> Optional[str]:
    """The deny reason when a simple command of this chain (``simple_commands``' shape) reads a secret
    file (_secret_read) or prints a secret variable (echo $HF_TOKEN, printenv GITHUB_TOKEN, env | grep
    -i token), also through a runner (sudo, env, nice, timeout); else None."""
    for i, (words, op) in enumerate(parts):
        words = unwrap(words)
        if not words:
            continue
        secret = _secret_read(words)
        if secret:
            return secret
        exe = os.path.basename(words[0])
        shown = []
        if exe in ("echo", "printf"):
            shown = [v for w in words[1:] for v in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", w)]
        elif exe == "printenv":
            shown = words[1:] or (["*"] if op in ("|", "|&") and i + 1 < len(parts)
                                  and SECRET_VAR.search(" ".join(parts[i + 1][0])) else [])
        elif exe in ("env", "set", "export") and len(words) == 1 and op in ("|", "|&") and i + 1 < len(parts):
            shown = ["*"] if SECRET_VAR.search(" ".join(parts[i + 1][0])) else []
        if any(v == "*" or SECRET_VAR.search(v) for v in shown):
            return "Printing secret variables puts them in the transcript: tell the user what is missing instead."
    return None


def _secret_inside(items: Optional[list], depth: int) -> Optional[str]:
    """_secret_in of the simple commands inside the shells' -c strings (and eval's) of ``items``, to
    MAX_NEST levels."""
    for pairs, _ in items or []:
        sc = _shell_c(pairs) if pairs and depth < MAX_NEST else None
        if sc is None:
            continue
        try:
            sub = _raw_items(c_string(pairs, sc))
        except ValueError:  # an unclosed quote: the shell runs nothing
            continue
        secret = _secret_in([([w for _, w in inner], op) for inner, op in sub if inner]) or \
            _secret_inside(sub, depth + 1)
        if secret:
            return secret
    return None


V4_ARGS = re.compile(r"\b(evaluation_strategy|overwrite_output_dir)\s*=")


# ----------------------------------------------------------------------------- the project's transformers
# The version that matters is the one the user's training imports, not the one of the interpreter that
# runs this hook (hooks.json runs the python3 on PATH, often a bare one): found by reading folders,
# never by running a Python or importing transformers (a hook is a hot path).
VENV_DIRS = (".venv", "venv")
DIST_INFO = re.compile(r"^transformers-(\d[^-]*?)(?:-py\d.*)?\.(?:dist|egg)-info$", re.I)
VERSION_DIR = re.compile(r"^python(\d+\.\d+)$")


def _transformers_in(site: Path) -> Optional[str]:
    """The version of the transformers installed in the site-packages folder ``site`` (its
    ``transformers-VERSION.dist-info``, or .egg-info), the highest if there are several; None when none."""
    try:
        names = os.listdir(site)
    except OSError:
        return None
    found = [m[1] for m in map(DIST_INFO.match, names) if m]
    return max(found, key=lambda v: [int(x) if x.isdigit() else -1 for x in re.split(r"[.+-]", v)]) if found else None


def _venv_sites(venv: Path, home: str) -> list[Path]:
    """A virtual environment's site-packages, then its base Python's when its pyvenv.cfg includes them."""
    sites = sorted(venv.glob("lib/python3*/site-packages")) + [venv / "Lib" / "site-packages"]
    try:
        cfg = dict(ln.partition("=")[::2] for ln in (venv / "pyvenv.cfg").read_text(errors="replace").splitlines())
    except OSError:
        cfg = {}
    cfg = {k.strip().lower(): v.strip() for k, v in cfg.items()}
    if cfg.get("include-system-site-packages", "").lower() == "true" and cfg.get("home"):
        sites += _prefix_sites(Path(cfg["home"]).parent, "", home) or []
    return sites


def _prefix_sites(prefix: Path, exe_name: str, home: str) -> Optional[list[Path]]:
    """The site-packages of the Python installed under ``prefix`` (/usr, /opt/conda, ~/.pyenv/versions/3.11.7),
    in its sys.path's order: the user's ~/.local, then Debian's local and system folders, then the
    prefix's own; the version from ``exe_name`` (python3.11) when it names one. None when no Python is
    installed there (no lib/pythonX.Y)."""
    m = VERSION_DIR.match(exe_name)
    try:
        versions = [m[1]] if m else sorted((VERSION_DIR.match(d)[1] for d in os.listdir(prefix / "lib")
                                            if VERSION_DIR.match(d)), reverse=True)
    except OSError:
        return None
    if not versions or not any((prefix / "lib" / f"python{v}").is_dir() for v in versions):
        return None
    sites = []
    for v in versions:
        sites += [Path(home) / ".local" / "lib" / f"python{v}" / "site-packages",
                  prefix / "local" / "lib" / f"python{v}" / "dist-packages",
                  prefix / "lib" / f"python{v}" / "site-packages", prefix / "lib" / f"python{v}" / "dist-packages"]
    return sites + [prefix / "lib" / "python3" / "dist-packages"]


def _pyenv_version(root: Path, cwd: Path, env: dict) -> str:
    """The version a pyenv shim runs: $PYENV_VERSION, else the nearest .python-version, else root/version."""
    if env.get("PYENV_VERSION"):
        return env["PYENV_VERSION"].split(":")[0]
    for d in (cwd, *cwd.parents, root):
        f = d / (".python-version" if d != root else "version")
        try:
            words = f.read_text(errors="replace").split()
        except OSError:
            continue
        return words[0] if words else ""
    return ""


def _interpreter_sites(exe: Path, cwd: Path, env: dict, home: str) -> Optional[list[Path]]:
    """The site-packages of the Python at ``exe`` (found on PATH), read from the folders around it,
    without running it: a venv's (its pyvenv.cfg), a pyenv shim's version's, or its prefix's; None
    when it is none of these (then the next one on PATH is read)."""
    if (exe.parent.parent / "pyvenv.cfg").is_file():  # .venv/bin/python: a link out of the venv, not followed
        return _venv_sites(exe.parent.parent, home)
    if exe.parent.name == "shims" and (exe.parent.parent / "versions").is_dir():
        version = _pyenv_version(exe.parent.parent, cwd, env)
        target = exe.parent.parent / "versions" / version / "bin" / exe.name
        return _interpreter_sites(target, cwd, env, home) if version and version != "system" else None
    try:
        real = exe.resolve()
    except (OSError, RuntimeError):
        return None
    if (real.parent.parent / "pyvenv.cfg").is_file():
        return _venv_sites(real.parent.parent, home)
    return _prefix_sites(real.parent.parent, real.name, home)


def project_python(cwd: str, env: dict) -> Optional[tuple[str, list[Path]]]:
    """The Python the user's training runs, found without running one, and its site-packages folders:
    the .venv or venv of ``cwd`` or a folder above it, else $VIRTUAL_ENV, else $CONDA_PREFIX, else the
    first python3 or python on PATH (a venv, a pyenv shim's version, a prefix); None when there is none."""
    home = env.get("HOME") or os.path.expanduser("~")
    here = Path(os.path.abspath(os.path.expanduser(cwd or ".")))
    for d in (here, *here.parents):
        for name in VENV_DIRS:
            if (d / name / "pyvenv.cfg").is_file():
                return str(d / name), _venv_sites(d / name, home)
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        prefix = Path(env.get(var) or "")
        if env.get(var) and prefix.is_absolute():
            sites = _venv_sites(prefix, home) if (prefix / "pyvenv.cfg").is_file() else _prefix_sites(prefix, "", home)
            if sites:
                return str(prefix), sites
    for d in env.get("PATH", "").split(os.pathsep):
        if not d:
            continue
        for name in ("python3", "python"):
            exe = Path(d if os.path.isabs(d) else here / d) / name
            if exe.is_file() and os.access(exe, os.X_OK):
                sites = _interpreter_sites(exe, here, env, home)
                if sites is not None:
                    return str(exe), sites
    return None


def installed_transformers(cwd: str, env: dict) -> tuple[Optional[str], str]:
    """(the transformers version the project's Python has, or None when it has none; that Python, in
    words). Read from project_python's site-packages; only when no project Python is found at all,
    from this hook's own interpreter's metadata."""
    found = project_python(cwd, env)
    if found is None:
        from importlib import metadata  # the rare path: no Python of the user's found
        try:
            return metadata.version("transformers"), f"{sys.executable} (no other Python found)"
        except (metadata.PackageNotFoundError, ValueError):
            return None, f"{sys.executable} (no other Python found)"
    where, sites = found
    return next((v for v in map(_transformers_in, sites) if v), None), where


def _major(version: Optional[str]) -> Optional[int]:
    m = re.match(r"\d+", version or "")
    return int(m[0]) if m else None


def rule_v5_arguments(call: Call) -> Optional[str]:
    """evaluation_strategy= and overwrite_output_dir= in a .py file, refused when the project's Python has
    transformers v5 or later (they raise TypeError there). With v4 they are fine, and when no
    transformers is found for the project the version is unknown: allowed (a v4 user must not be
    blocked; v5 fails loudly at the first TrainingArguments, before any GPU time), and said on stderr."""
    if call.tool not in ("Write", "Edit", "MultiEdit") or not call.path.endswith(".py"):
        return None
    found = sorted(set(V4_ARGS.findall(call.content)))
    if not found:
        return None
    version, where = installed_transformers(call.cwd, call.env)
    major = _major(version)
    if major is None:
        call.memo.setdefault("notes", []).append(
            f"supervise guard: v5_arguments allowed {', '.join(found)} in {call.path}: no transformers is installed "
            f"for {where}, so its version is unknown (v4 keeps them; v5 raises TypeError)")
        return None
    if major < 5:
        return None
    return _deny("v5_arguments", f"{', '.join(found)} were removed in transformers v5 ({version} is installed for "
                 f"{where}): TrainingArguments raises TypeError.", "write eval_strategy= instead of "
                 "evaluation_strategy=, and drop overwrite_output_dir=")


# notified before the environment rules: a detached launch's fix is the launcher line, which
# sets the environment itself
RULES: dict[str, Callable[[Call], Optional[str]]] = {
    "one_line": rule_one_line, "notified": rule_notified, "unbuffered": rule_unbuffered,
    "quiet_env": rule_quiet_env, "no_log_dumps": rule_no_log_dumps,
    "no_credential_hunting": rule_no_credential_hunting, "v5_arguments": rule_v5_arguments,
}


def truncate(call: Call) -> Call:
    """The call itself, or, for a command longer than MAX_COMMAND, a copy that holds its first
    MAX_COMMAND characters (cut at the last line break, else the last blank) with ``read`` set."""
    if len(call.command) <= MAX_COMMAND:
        return call
    head = call.command[:MAX_COMMAND]
    cut = max(head.rfind("\n"), head.rfind(" "))
    head = head[:cut] if cut > MAX_COMMAND // 2 else head
    return Call(call.tool, head, call.background, call.cwd, call.env, call.content, call.path, read=len(call.command))


def decide(call: Call) -> Optional[str]:
    """The first rule that denies, as its reason; None allows. A command past MAX_COMMAND is
    decided on its first MAX_COMMAND characters: a deny then says so and offers no corrected
    command (it would be cut too)."""
    off = {r.strip() for r in call.env.get("SUPERVISE_GUARD_OFF", "").split(",")}
    asked = call
    call = truncate(call)
    call.memo["notes"] = asked.memo.setdefault("notes", [])  # what a rule says on stderr when it allows
    for name, rule in RULES.items():
        if name not in off:
            reason = rule(call)
            if reason:
                if call.read:
                    reason += (f" (Decided on the first {MAX_COMMAND >> 10} KiB of this {call.read / 1024:,.0f} KiB "
                               "command: put the steps in a script file.)")
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
        call = call_from_hook(data, os.environ if env is None else env)
        reason = decide(call)
        if reason is None and len(call.command) > MAX_COMMAND:
            print(f"supervise guard: allowed after reading the first {MAX_COMMAND >> 10} KiB of a "
                  f"{len(call.command) / 1024:,.0f} KiB command", file=sys.stderr)
        for note in call.memo.get("notes", []) if reason is None else []:
            print(note, file=sys.stderr)
    except Exception as e:  # decide on purpose, never by crashing: allow, and say so
        print(f"supervise guard: allowed without a check ({type(e).__name__}: {str(e)[:120]})", file=sys.stderr)
        return 0
    if reason:
        json.dump({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                          "permissionDecisionReason": reason[:9000]}}, stdout)
    return 0
