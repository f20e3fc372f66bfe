"""Schemathesis hooks for the run against a live node (run.sh).

- `posted_events_are_readable`, a state check: every event a `POST /events`
  acknowledges (201) is read back by a page, with the payload that was
  posted, at the stream, seq and lamport the answer named.
- NDJSON bodies are sent as the text generated for them.
- A peer URL a case would add (one the document calls valid) is pointed at
  a closed loopback port, so a fuzzed `POST /peers` never makes the node
  dial a host on the network; what the document calls invalid is sent as
  generated, to be refused.
"""

from __future__ import annotations

import base64
import json
import os
import re

import requests
import schemathesis

NODE = os.environ["MESHLOG_NODE_URL"]
# The node runs with secrets; the read-back is an admin's read.
AUTH = {"Authorization": "Bearer " + os.environ["MESHLOG_TOKEN"]}
# Port 1 on loopback: nothing listens there; the node's dials fail at once.
PEER_SINK = "http://127.0.0.1:1"
# The document's pattern for a peer URL (PeerBody.url).
PEER_URL = None


@schemathesis.hook
def after_load_schema(context, schema):
    global PEER_URL
    pattern = schema.raw_schema["components"]["schemas"]["PeerBody"]["properties"]["url"]["pattern"]
    PEER_URL = re.compile(pattern)


@schemathesis.serializer("application/x-ndjson")
def ndjson_serializer(ctx, value):
    if isinstance(value, bytes):
        return {"data": value}
    if not isinstance(value, str):
        value = json.dumps(value)
    return {"data": value.encode("utf-8", "surrogatepass")}


@schemathesis.hook
def before_call(context, case, kwargs):
    if case.operation.path == "/peers" and isinstance(case.body, dict):
        url = case.body.get("url")
        if isinstance(url, str) and PEER_URL.search(url):
            case.body = {**case.body, "url": PEER_SINK}


def _element_bytes(element):
    """One batch element's payload, or None if the node must refuse it."""
    if isinstance(element, str):
        return element.encode("utf-8")
    if isinstance(element, dict) and set(element) == {"payload"}:
        return element["payload"].encode("utf-8")
    if isinstance(element, dict) and set(element) == {"payload_base64"}:
        return base64.b64decode(element["payload_base64"], validate=True)
    return None


def _posted_payloads(request):
    """The payloads the request that went out carried, in order, as the node
    reads them (`post_events`); None where the node must have refused."""
    media = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    body = request.body or b""
    if isinstance(body, str):
        body = body.encode("utf-8")
    try:
        if media == "application/json":
            return [_element_bytes(element) for element in json.loads(body)]
        if media == "application/x-ndjson":
            lines = [line.removesuffix(b"\r") for line in body.split(b"\n")]
            # Blank as the node reads it: Rust's `is_ascii_whitespace`.
            blank = lambda line: all(byte in b" \t\n\x0c\r" for byte in line)  # noqa: E731
            return [_element_bytes(json.loads(line)) for line in lines if not blank(line)]
    except Exception:  # noqa: BLE001 - unparseable: the node answered 400
        return None
    return [body]


def _read_back(stream, lamport, count):
    """The page of `stream` that follows the events stamped below `lamport`
    (the legacy scalar position `lamport - 1`), resuming past compactions
    the node reports; and the seqs those reports say were lost."""
    after = str(lamport - 1)
    lost_seqs = set()
    for _ in range(10):
        params = {"stream": stream, "after": after, "limit": str(count)}
        page = requests.get(f"{NODE}/events", params=params, headers=AUTH, timeout=10)
        if page.status_code != 410:
            return lost_seqs, page
        stale = page.json()
        for lost in stale["lost"]:
            if lost["stream"] == stream:
                lost_seqs.update(range(lost["first"], lost["last"] + 1))
        after = stale["resume"]
    return lost_seqs, page


COMPACT = "application/vnd.meshlog.compact+json"


def _appended(response):
    """The events a 201 names, in the default answer's shape: the compact
    answer (`Accept: application/vnd.meshlog.compact+json`) gives ranges,
    one event per seq, stamps rising by one with it."""
    media = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
    answer = response.json()
    if media != COMPACT:
        return answer["events"]
    if "seq" not in answer:
        return []
    (first, last), (lamport_first, lamport_last) = answer["seq"], answer["lamport"]
    assert lamport_last - lamport_first == last - first, f"ranges differ in length: {answer}"
    return [
        {"stream": answer["stream"], "seq": seq, "lamport": lamport_first + seq - first}
        for seq in range(first, last + 1)
    ]


@schemathesis.check
def posted_events_are_readable(ctx, response, case):
    """Every event a 201 names is returned by a page, with its payload."""
    if case.operation.method.upper() != "POST" or case.operation.path != "/events":
        return None
    if response.status_code != 201:
        return None
    appended = _appended(response)
    if not appended:
        return None
    payloads = _posted_payloads(response.request)
    if payloads is not None and None not in payloads:
        assert len(payloads) == len(appended), (
            f"{len(payloads)} payloads posted, {len(appended)} events acknowledged"
        )
    first = appended[0]
    stream = first["stream"]
    for index, event in enumerate(appended):
        assert event["stream"] == stream, f"a batch spans streams: {appended}"
        assert event["seq"] == first["seq"] + index, f"seqs are not consecutive: {appended}"
    # An event compacted between the append and the read is one the node
    # said it lost (a stale answer names it): not skipped, so not missing.
    lost_seqs, page = _read_back(stream, first["lamport"], len(appended))
    assert page.status_code == 200, f"reading back: {page.status_code} {page.text[:300]}"
    events = page.json()["events"]
    read = {event["seq"]: event for event in events}
    for index, event in enumerate(appended):
        if event["seq"] in lost_seqs:
            continue
        got = read.get(event["seq"])
        assert got is not None, (
            f"event {stream}/{event['seq']} was acknowledged but is not read back: {events}"
        )
        assert got["lamport"] == event["lamport"], f"lamport differs: {got} vs {event}"
        if payloads is not None and payloads[index] is not None:
            if "payload" in got:
                body = got["payload"].encode("utf-8")
            else:
                body = base64.b64decode(got["payload_base64"])
            assert body == payloads[index], (
                f"event {stream}/{event['seq']}: posted {payloads[index]!r}, read {body!r}"
            )
    return None
