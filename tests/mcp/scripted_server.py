"""A stdio MCP server whose answers a test scripts, for what no published server does:
negotiate a draft or future version, offer tools with illegal names, crash, fall silent.

Usage: python scripted_server.py SCRIPT.json — the script's keys:
  version    the protocolVersion to answer initialize with (absent: echo the client's)
  tools      the tools, served in pages of ``page`` (default: all in one page)
  record     a file to append every message received to, one JSON line each
  call_seconds  how long each tools/call takes before it is answered (default 0)
  behaviour  "normal", "exit" (exit 3 at once, after a line on stderr), "silent",
             "same-cursor" (every tools/list page names the first page as the next) or
             "new-cursors" (every tools/list page names a new cursor, forever), or
             "chatty" (a log notification of ``chatty_bytes``, default 16 KiB, written for
             each 64 KiB read, as the input comes: a server that logs as it reads a request)
  list_raw   a line to answer tools/list with, verbatim but for @ID@, the request's id
  call_raw   the same for tools/call
  call_text  the text a tools/call answers (instead of echoing its arguments)
  link       [target, link]: make the symbolic link before serving (the server runs as
             the caller of ctxmcp, and may change what that caller's paths lead to)

tools/call echoes its arguments (and the uid it runs as); the tool named "fail" reports an
error result.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    with open(sys.argv[1]) as f:
        script = json.load(f)
    behaviour = script.get("behaviour", "normal")
    if behaviour == "exit":
        print("scripted failure: no such API key", file=sys.stderr)
        return 3
    if script.get("link"):
        os.symlink(*script["link"])
    tools = script.get("tools", [])
    pages = 0
    page = script.get("page") or max(1, len(tools))
    chatty = script.get("chatty_bytes", 16384)
    for line in chatty_lines(chatty) if behaviour == "chatty" else sys.stdin:
        message = json.loads(line)
        if script.get("record"):
            with open(script["record"], "a") as record:
                record.write(json.dumps(message) + "\n")
        if behaviour == "silent":
            time.sleep(3600)
        if "id" not in message:
            continue
        method, params = message["method"], message.get("params", {})
        raw = script.get({"tools/list": "list_raw", "tools/call": "call_raw"}.get(method, ""))
        if raw:
            sys.stdout.write(raw.replace("@ID@", str(message["id"])) + "\n")
            sys.stdout.flush()
            continue
        if method == "tools/call":
            time.sleep(script.get("call_seconds", 0))
        if method == "initialize":
            version = script.get("version", params.get("protocolVersion"))
            result = {"protocolVersion": version, "capabilities": {"tools": {}}}
            result["serverInfo"] = {"name": "scripted", "version": "1"}
            if version is None:
                del result["protocolVersion"]
        elif method == "tools/call" and params.get("name") == "fail":
            text = "the remote tool failed on purpose"
            result = {"content": [{"type": "text", "text": text}], "isError": True}
        elif method == "tools/call" and "call_text" in script:
            result = {"content": [{"type": "text", "text": script["call_text"]}]}
        elif method == "tools/call":
            arguments = params.get("arguments", {})
            result = {
                "content": [{"type": "text", "text": json.dumps(arguments)}],
                "structuredContent": {"echo": arguments, "uid": os.getuid()},
                "isError": False,
            }
        elif method == "tools/list" and behaviour == "new-cursors":
            pages += 1
            result = {"tools": [], "nextCursor": f"page-{pages}"}
        elif method == "tools/list":
            start = int(params.get("cursor", 0))
            result = {"tools": tools[start : start + page]}
            if start + page < len(tools):
                result["nextCursor"] = str(start + page)
            if behaviour == "same-cursor":
                result["nextCursor"] = "0"
        else:
            reply = {"jsonrpc": "2.0", "id": message["id"]}
            reply["error"] = {"code": -32601, "message": f"no method {method}"}
            print(json.dumps(reply), flush=True)
            continue
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
    return 0


def chatty_lines(size: int):
    """The lines of standard input, read 64 KiB at a time, each read followed by a log
    notification of about ``size`` bytes written whole before the next read."""
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {}}
    note["params"] = {"level": "debug", "data": "x" * size}
    pending = b""
    while chunk := os.read(0, 65536):
        sys.stdout.write(json.dumps(note) + "\n")
        sys.stdout.flush()
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from lines


if __name__ == "__main__":
    sys.exit(main())
