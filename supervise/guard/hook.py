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
import sys
from typing import Callable, Optional

from supervise.guard.launches import rule_notified, rule_one_line, rule_quiet_env, rule_unbuffered
from supervise.guard.logs import rule_no_log_dumps
from supervise.guard.secrets import rule_no_credential_hunting
from supervise.guard.shell import Call, MAX_COMMAND
from supervise.guard.transformers import rule_v5_arguments

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
