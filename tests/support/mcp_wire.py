"""The wire of the stdio MCP servers the tests run, on raw pipes with the standard library
only: one JSON-RPC message a line each way.

:data:`WIRE` is the opening of such a server's program text (``send_bytes``, ``send``,
``receive``); a server goes on from it with its own arguments and answers."""

WIRE = r"""
import json, os, sys, time

buffer = b""

def send_bytes(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]

def send(message):
    send_bytes(json.dumps(message).encode() + b"\n")

def receive():
    global buffer
    while b"\n" not in buffer:
        chunk = os.read(0, 65536)
        if not chunk:
            sys.exit(0)
        buffer += chunk
    line, _, buffer = buffer.partition(b"\n")
    return json.loads(line)
"""
