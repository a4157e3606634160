"""scripts/serve.py as a client sees it: a real server on 127.0.0.1, answers checked against the
Translator's, every client mistake a 4xx naming the field, and the server serving on after it.

The models are the learning tests' Luong and Transformer trained on the copy task: decisive
enough that merging requests into other batches (other padding, other summation orders) cannot
flip a near-tie, so answers are compared exactly.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from seq2seq import Translator
from seq2seq.data.tokenization import unknown_words
from seq2seq.explorer.page import read_page
from seq2seq.inference.bundle import export_bundle, load
from seq2seq.pipeline import train
from seq2seq.serving.server import ROUTES
from tests.configs import ROOT, compose_config
from tests.test_learning import COPY, MODELS

SENTENCES = ["w3 w14 w7", "w1 w2 w3 w4 w5 w6 w7 w8", "w40", "", "w9 w9 w9 w10 w11"]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> bundle of a Luong and a Transformer that copy."""
    made = {}
    for name in ["luong", "transformer"]:
        run_dir = tmp_path_factory.mktemp(f"{name}_run")
        result = train(compose_config([*COPY, *MODELS[name], f"run_dir={run_dir}"]))
        made[name] = export_bundle(load(result["best_checkpoint"]), run_dir / "bundle")
    return made


class Server:
    """A scripts/serve.py process and a client for it."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path, port: int) -> None:
        self.process, self.log, self.port = process, log, port

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    def translate(self, payload: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        return self.request("POST", "/translate", json.dumps(payload).encode(), headers)


def start_server(arguments: list[str], log: Path, env: dict[str, str] | None = None) -> Server:
    """Start serve.py on a free port; return once GET /health says ready."""
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "scripts/serve.py", "--port", "0", "--threads", "2", *arguments],
            cwd=ROOT,
            env={**(env or os.environ), "PYTHONPATH": str(ROOT)},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 120
    while not (found := re.search(r"running on http://127\.0\.0\.1:(\d+)", log.read_text())):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    server = Server(process, log, int(found.group(1)))
    while server.request("GET", "/health")[0] != 200:
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    return server


def stop(server: Server) -> int:
    server.process.send_signal(signal.SIGTERM)
    return server.process.wait(timeout=60)


@pytest.fixture(scope="module")
def server(bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("server") / "log"
    models = [f"--model={name}={path}" for name, path in bundles.items()]
    running = start_server([*models, "--max-sentences", "8", "--max-beam-size", "6"], log)
    yield running
    assert stop(running) == 0, log.read_text()[-3000:]


def test_health_and_models_describe_what_is_served(
    server: Server, bundles: dict[str, Path]
) -> None:
    status, health = server.request("GET", "/health")
    assert status == 200 and health["status"] == "ready"
    assert health["models"] == ["luong", "transformer"]
    status, described = server.request("GET", "/models")
    assert status == 200
    by_name = {model["name"]: model for model in described["models"]}
    for name, path in bundles.items():
        translator = Translator.load(path)
        model = by_name[name]
        assert model["parameters"] == sum(p.numel() for p in translator.model.parameters())
        assert model["src_vocab_size"] == translator.src_tokenizer.get_vocab_size()
        assert model["tgt_vocab_size"] == translator.tgt_tokenizer.get_vocab_size()
        assert model["backend"] == "torch"
    assert by_name["luong"]["architecture"] == "Seq2Seq"
    assert by_name["luong"]["decoder"] == "LuongDecoder"
    assert by_name["luong"]["scoring"] == "DotProductAttention"
    assert by_name["transformer"]["architecture"] == "Transformer"
    assert by_name["transformer"]["num_heads"] == 4
    assert "listening" not in server.log.read_text()  # no warning: it listens on 127.0.0.1


@pytest.mark.parametrize("name", ["luong", "transformer"])
def test_translations_scores_n_best_and_attention_are_the_translators(
    server: Server, bundles: dict[str, Path], name: str
) -> None:
    translator = Translator.load(bundles[name])
    status, answer = server.translate({"model": name, "src": SENTENCES})
    assert status == 200 and answer["model"] == name
    assert [r["tgt"] for r in answer["results"]] == translator.translate(SENTENCES)
    assert [r["src"] for r in answer["results"]] == SENTENCES
    assert all("unknown" not in r for r in answer["results"])  # the toy's own words
    # Words the vocabulary lacks: said per sentence, each once in order; the translation is the
    # translator's all the same.
    odd = ["w1 zebra w2 pizza zebra", "w3"]
    status, answer = server.translate({"model": name, "src": odd})
    assert status == 200 and [r.get("unknown") for r in answer["results"]] == [
        list(unknown_words(translator.src_tokenizer, [odd[0]])),
        None,
    ]
    assert answer["results"][0]["unknown"][0] == "zebra"
    assert [r["tgt"] for r in answer["results"]] == translator.translate(odd)

    payload = {"model": name, "src": SENTENCES, "beam_size": 4, "n_best": 3}
    status, answer = server.translate(
        {**payload, "return_scores": True, "length_penalty": 1.0, "coverage_penalty": 0.5}
    )
    expected = translator.translate_detailed(
        SENTENCES, beam_size=4, length_penalty=1.0, n_best=3, with_scores=True,
        coverage_penalty=0.5,
    )  # fmt: skip
    assert status == 200
    for got, want in zip(answer["results"], expected, strict=True):
        assert got["tgt"] == want.text
        assert got["pred_score"] == pytest.approx(want.score, abs=1e-5)
        assert [a["tgt"] for a in got["n_best"]] == [text for text, _ in want.n_best or []]
        scores = [score for _, score in want.n_best or []]
        assert [a["pred_score"] for a in got["n_best"]] == pytest.approx(scores, abs=1e-5)

    status, answer = server.translate({"model": name, "src": SENTENCES, "return_attention": True})
    expected = translator.translate_detailed(SENTENCES, with_attention=True)
    for got, want in zip(answer["results"], expected, strict=True):
        attention = got["attention"]
        assert attention["src_tokens"] == (want.src_tokens or [])
        assert attention["tgt_tokens"] == (want.tgt_tokens or [])
        if want.attention is None:  # a blank sentence
            assert attention["weights"] == []
        else:
            assert torch.allclose(torch.tensor(attention["weights"]), want.attention, atol=1e-5)


def test_concurrent_requests_each_get_their_own_translations(
    server: Server, bundles: dict[str, Path]
) -> None:
    translator = Translator.load(bundles["luong"])
    requests = [[f"w{i} w{i + 1}", f"w{(i * 7) % 45 + 1} w3 w{i % 9 + 1}"] for i in range(1, 41)]
    expected = [translator.translate(sentences) for sentences in requests]
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(
            pool.map(lambda src: server.translate({"model": "luong", "src": src}), requests)
        )
    assert all(status == 200 for status, _ in answers)
    assert [[r["tgt"] for r in answer["results"]] for _, answer in answers] == expected


BAD_REQUESTS = [
    (b"{bad", 400, "not valid JSON"),
    (b'{"model": "luong", "src": ["\xff"]}', 400, "not valid UTF-8"),
    (b'["w1"]', 422, "JSON object"),
    (b'{"model": "luong"}', 422, "src: Field required"),
    (b'{"model": "luong", "src": "w1"}', 422, "src: Input should be a valid list"),
    (b'{"model": "luong", "src": [1]}', 422, "src.0: Input should be a valid string"),
    (b'{"model": "luong", "src": []}', 422, "src: the list is empty"),
    (b'{"model": "luong", "src": ["w1", "w1", "w1", "w1", "w1", "w1", "w1", "w1", "w1"]}', 422,
     "src: 9 sentences; the limit is 8"),
    (b'{"model": "luong", "src": ["' + b"w1 " * 700 + b'"]}', 422, "src.0: 2100 characters"),
    (b'{"model": "luong", "src": ["\\ud800"]}', 422, "src.0: the sentence holds a lone surrogate"),
    (b'{"model": "nope", "src": ["w1"]}', 404, "model: no model 'nope' here"),
    (b'{"src": ["w1"]}', 422, "model: this server has several models"),
    (b'{"model": "luong", "src": ["w1"], "beam_size": 0}', 422, "beam_size: 0"),
    (b'{"model": "luong", "src": ["w1"], "beam_size": 7}', 422, "from 1 to 6"),
    (b'{"model": "luong", "src": ["w1"], "beam_size": "5"}', 422, "beam_size: Input should be"),
    (b'{"model": "luong", "src": ["w1"], "beam_size": 3, "n_best": 4}', 422, "n_best: 4"),
    (b'{"model": "luong", "src": ["w1"], "length_penalty": NaN}', 422, "length_penalty: nan"),
    (b'{"model": "luong", "src": ["w1"], "coverage_penalty": -Infinity}', 422,
     "coverage_penalty: -inf"),
    (b'{"model": "luong", "src": ["w1"], "beam_size": Infinity}', 422, "beam_size: Input should"),
    (b'{"model": "luong", "src": ["w1"], "length_penalty": -1}', 422, "length_penalty: -1"),
    (b'{"model": "luong", "src": ["w1"], "coverage_penalty": -1}', 422, "coverage_penalty: -1"),
    (b'{"model": "luong", "src": ["w1"], "coverage_penalty": 11}', 422, "from 0 to 10"),
    (b'{"model": "luong", "src": ["w1"], "return_scores": 1}', 422, "return_scores: Input should"),
    (b'{"model": "luong", "src": ["w1"], "beams": 5}', 422, "beams: Extra inputs"),
    # A 2 KB body nested 1,000 deep, and a 5,000-digit integer, once answered a 500 (#61).
    (b'{"src": ' + b"[" * 1000 + b"]" * 1000 + b"}", 400, "nests arrays or objects too deeply"),
    (b'{"model": "luong", "src": ["w1"], "beam_size": ' + b"9" * 5000 + b"}", 422,
     "beam_size: an integer of 5000 digits; no field takes one so long"),
    (b'{"model": "luong", "src": ["w1"], "length_penalty": -' + b"9" * 5000 + b"}", 422,
     "length_penalty: an integer of 5000 digits"),
    (b'{"model": "luong", "src": [' + b"9" * 5000 + b"]}", 422,
     "src.0: Input should be a valid string"),
    (b'{"model": "luong", "src": ["w1"], "beam_size": ' + b"9" * 4000 + b"}", 422,
     "beam_size: 99999999… (4000 digits); it must be from 1 to 6"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "message"), BAD_REQUESTS)
def test_a_bad_request_is_a_4xx_naming_the_field_and_the_server_goes_on(
    server: Server, body: bytes, status: int, message: str
) -> None:
    got, answer = server.request("POST", "/translate", body)
    assert (got, list(answer)) == (status, ["error"])
    assert message in answer["error"] and "Traceback" not in answer["error"]
    assert server.translate({"model": "luong", "src": ["w1 w2"]})[0] == 200


def raw_request(
    server: Server,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and the raw body of one request."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()  # fmt: skip


def test_routes_methods_head_and_a_byte_order_mark_answer_as_documented(server: Server) -> None:
    """Unknown routes and methods answer {"error": ...} like every other mistake, HEAD /health
    is a probe's health check, and a UTF-8 byte-order mark before the JSON is no mistake."""
    status, answer = server.request("GET", "/nope")
    assert status == 404 and "no route /nope; the routes are POST /translate" in answer["error"]
    status, answer = server.request("DELETE", "/translate")
    assert status == 405 and answer == {"error": "DELETE is not allowed on /translate."}
    status, _, body = raw_request(server, "HEAD", "/health")
    assert status == 200 and body == b""
    payload = json.dumps({"model": "luong", "src": ["w1 w2"]}).encode()
    assert server.request("POST", "/translate", b"\xef\xbb\xbf" + payload)[0] == 200


def test_a_body_over_the_limit_is_refused(server: Server) -> None:
    status, answer = server.request("POST", "/translate", b" " * 1_000_001)  # Content-Length
    assert status == 413 and "1000001 bytes; the limit is 1000000" in answer["error"]
    # Chunked, with no length up front: refused once the chunks pass the limit.
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    chunks = (b" " * 100_000 for _ in range(11))
    connection.request("POST", "/translate", body=chunks, encode_chunked=True)
    response = connection.getresponse()
    assert response.status == 413
    assert "over the limit of 1000000 bytes" in json.loads(response.read())["error"]
    connection.close()
    assert server.translate({"model": "luong", "src": ["w1 w2"]})[0] == 200


def test_an_api_key_is_required_when_set(bundles: dict[str, Path], tmp_path: Path) -> None:
    env = {**os.environ, "SEQ2SEQ_API_KEY": "s3cret"}
    server = start_server([f"--model={bundles['luong']}"], tmp_path / "log", env)
    try:
        payload = {"src": ["w1 w2"]}  # one model: no name needed
        assert server.translate(payload)[0] == 401
        status, headers, _ = raw_request(server, "POST", "/translate", json.dumps(payload).encode())
        assert status == 401 and headers["www-authenticate"] == "Bearer"
        status, answer = server.translate(payload, {"Authorization": "Bearer wrong"})
        assert status == 401 and "not the server's API key" in answer["error"]
        status, answer = server.translate(payload, {"Authorization": "Basic a2V5"})
        assert status == 401 and "the scheme must be Bearer, not 'Basic'" in answer["error"]
        assert server.request("GET", "/models")[0] == 401
        status, answer = server.translate(payload, {"Authorization": "Bearer s3cret"})
        assert status == 200 and answer["model"] == "bundle"  # named after the directory
        sentence = json.dumps({"src": "w1 w2"}).encode()
        assert server.request("POST", "/explore", sentence)[0] == 401
        headers = {"Authorization": "Bearer s3cret"}
        assert server.request("POST", "/explore", sentence, headers)[0] == 200
        # The schema says so, for a generated client: a bearer scheme on the guarded routes.
        schema = server.request("GET", "/openapi.json")[1]
        assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        for path in ("/translate", "/models", "/explore"):
            assert all(op["security"] == [{"bearer": []}] for op in schema["paths"][path].values())
        assert "security" not in schema["paths"]["/health"]["get"]
    finally:
        assert stop(server) == 0


def test_sigterm_finishes_the_requests_in_flight_and_exits_0(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    # A request waits 3 s for others to join it: SIGTERM comes while it is in flight.
    server = start_server(
        [f"--model=luong={bundles['luong']}", "--max-wait-ms", "3000"], tmp_path / "log"
    )
    answers: list[tuple[int, Any]] = []
    client = threading.Thread(
        target=lambda: answers.append(server.translate({"src": ["w5 w6 w7"]}))
    )
    client.start()
    while server.request("GET", "/health")[1]["pending"]["luong"] != 1:
        time.sleep(0.01)
    assert stop(server) == 0
    client.join(timeout=60)
    expected = Translator.load(bundles["luong"]).translate(["w5 w6 w7"])
    assert answers == [
        (200, {"model": "luong", "results": [{"src": "w5 w6 w7", "tgt": expected[0]}]})
    ]


def test_bad_command_lines_and_models_that_do_not_load_stop_with_a_message(
    tmp_path: Path, bundles: dict[str, Path]
) -> None:
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    for arguments, message in [
        (["--model", f"a={tmp_path / 'missing'}"], "does not exist"),
        (["--model", f"a={bundles['luong']}", "--model", f"a={bundles['luong']}"], "is taken"),
        (["--model", f"a={not_a_model}"], "could not be loaded"),
        (["--model", f"a={bundles['luong']}", "--port", "99999"], "must be from 0 to 65535"),
        (["--model", f"a={bundles['luong']}", "--host", "999.1.1.1"], "--host 999.1.1.1: not an"),
    ]:
        completed = subprocess.run(
            [sys.executable, "scripts/serve.py", "--port", "0", *arguments],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert completed.returncode == 2, completed.stderr[-3000:]
        assert message in completed.stderr and "Traceback" not in completed.stderr


def test_a_model_that_fails_is_a_500_with_its_message_and_the_server_goes_on(
    bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from seq2seq.serving.server import ModelSource, create_app

    real = Translator.translate_detailed

    def fragile(self: Translator, sentences: list[str], *args: Any, **kwargs: Any) -> Any:
        if "w13" in sentences:
            raise RuntimeError("out of memory")
        return real(self, sentences, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate_detailed", fragile)
    app = create_app([ModelSource("luong", bundles["luong"])])
    with TestClient(app) as client:
        deadline = time.monotonic() + 60
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        failed = client.post("/translate", json={"src": ["w13"]})
        assert failed.status_code == 500
        assert failed.json() == {"error": "model 'luong' failed: out of memory"}
        assert client.post("/translate", json={"src": ["w12"]}).status_code == 200


def test_the_live_explorer_page_and_its_sentences(server: Server, bundles: dict[str, Path]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("GET", "/")
    response = connection.getresponse()
    html = response.read().decode()
    connection.close()
    assert response.status == 200 and response.getheader("content-type", "").startswith("text/html")
    assert "http://" not in html and "https://" not in html
    data = read_page(html)
    assert data["live"]["needs_key"] is False and data["models"] == [] and data["sentences"] == []

    status, answer = server.request("POST", "/explore", json.dumps({"src": "w3 w14 w7"}).encode())
    assert status == 200
    assert [model["name"] for model in answer["models"]] == ["luong", "transformer"]
    for name, path in bundles.items():
        view = answer["sentence"]["models"][name]
        translator = Translator.load(path)
        assert view["hypothesis"] == translator.translate(["w3 w14 w7"])[0]
        [pair] = translator.force_decode(["w3 w14 w7"], [view["hypothesis"]])
        assert pair.attention is not None
        assert torch.allclose(torch.tensor(view["forced"]["weights"]), pair.attention, atol=1e-4)
    assert "heads" in answer["sentence"]["models"]["transformer"]
    for body, message in [
        (b"{bad", "the body is not valid JSON"),
        (b'{"src": ["w1"]}', "src: give one non-blank sentence"),
        (b'{"src": "   "}', "src: give one non-blank sentence"),
        (json.dumps({"src": "w1 " * 700}).encode(), "2100 characters"),
        (b'{"src": "w1", "coverage_penalty": 5}', "coverage_penalty: /explore takes only src"),
        (b'{"src": "w1", "bogus": 1}', "bogus: /explore takes only src"),
    ]:
        status, answer = server.request("POST", "/explore", body)
        assert status in (400, 422) and message in answer["error"], (body[:30], answer)


def test_liveness_readiness_and_request_ids(server: Server) -> None:
    """/health/live and /health/ready beside /health; every answer carries X-Request-ID (the
    client's when it is a plain token, else a new one) and the log has one line per request."""
    assert server.request("GET", "/health/live") == (200, {"status": "alive"})
    assert server.request("GET", "/health/ready") == server.request("GET", "/health")
    status, headers, _ = raw_request(server, "GET", "/health", headers={"X-Request-ID": "abc-1"})
    assert status == 200 and headers["x-request-id"] == "abc-1"
    for sent in ({}, {"X-Request-ID": "no spaces\tor tabs"}, {"X-Request-ID": "x" * 129}):
        status, headers, _ = raw_request(server, "GET", "/nowhere", headers=sent)
        assert status == 404 and re.fullmatch(r"[0-9a-f]{32}", headers["x-request-id"])
    _, headers, _ = raw_request(
        server, "POST", "/translate", json.dumps({"model": "luong", "src": ["w1"]}).encode(),
        {"X-Request-ID": "trace.42"},
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while "request trace.42: POST /translate -> 200 in " not in server.log.read_text():
        assert time.monotonic() < deadline, server.log.read_text()[-2000:]
        time.sleep(0.1)


def test_metrics_count_requests_batches_and_sentences(server: Server) -> None:
    """GET /metrics in Prometheus's format (read back with prometheus-client's own parser):
    requests by route and status, each model's batches and sentences, requests waiting."""
    before = scrape(server)
    body = json.dumps({"model": "luong", "src": ["w1 w2", "w3"]}).encode()
    for _ in range(3):
        assert raw_request(server, "POST", "/translate", body)[0] == 200
    assert raw_request(server, "GET", "/no/such/route")[0] == 404
    after = scrape(server)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    ok = {"method": "POST", "route": "/translate", "status": "200"}
    assert grew("seq2seq_requests_total", **ok) == 3
    assert grew("seq2seq_requests_total", method="GET", route="other", status="404") == 1
    assert grew("seq2seq_sentences_total", model="luong") == 6
    assert grew("seq2seq_batch_sentences_count", model="luong") >= 1
    assert grew("seq2seq_request_seconds_count", route="/translate") == 3
    assert after[("seq2seq_requests_waiting", (("model", "luong"),))] == 0


def test_a_full_queue_is_a_503_with_retry_after(bundles: dict[str, Path], tmp_path: Path) -> None:
    """--max-queue 1: while one request waits (3 s for others to join its batch), the next is
    turned away at once; once it is answered, requests are taken again."""
    server = start_server(
        [f"--model=luong={bundles['luong']}", "--max-wait-ms", "3000", "--max-queue", "1"],
        tmp_path / "log",
    )
    try:
        answers: list[tuple[int, Any]] = []
        client = threading.Thread(target=lambda: answers.append(server.translate({"src": ["w5"]})))
        client.start()
        while server.request("GET", "/health")[1]["pending"]["luong"] != 1:
            time.sleep(0.02)
        body = json.dumps({"src": ["w6"]}).encode()
        status, headers, raw = raw_request(server, "POST", "/translate", body)
        assert status == 503 and headers["retry-after"] == "1"
        assert (
            "waiting or in progress as the server takes (seq2seq serve --max-queue 1)"
            in (json.loads(raw)["error"])
        )
        client.join(timeout=60)
        assert answers and answers[0][0] == 200
        assert raw_request(server, "POST", "/translate", body)[0] == 200
    finally:
        assert stop(server) == 0


def scrape(server: Server) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics, parsed by prometheus-client's own parser: (sample name, sorted labels) ->
    value."""
    parser = pytest.importorskip("prometheus_client.parser")
    status, headers, body = raw_request(server, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in parser.text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def luong_count(server: Server, name: str) -> float:
    return scrape(server).get((name, (("model", "luong"),)), 0.0)


def wait_for_pending(server: Server, count: int) -> None:
    deadline = time.monotonic() + 30
    while server.request("GET", "/health")[1]["pending"]["luong"] != count:
        assert time.monotonic() < deadline, server.log.read_text()[-3000:]
        time.sleep(0.01)


def test_a_request_beyond_its_work_limits_is_a_413_naming_them(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """The bounds are the model's own: each sentence's length limit a·S + b times the beam
    size, and source × target weights for the attention; at the limit a request is answered."""
    sentences = ["w1 w2 w3 w4 w5 w6", "w7 w8 w9", ""]
    bounds = Translator.load(bundles["luong"]).bounds(sentences)
    tokens = sum(target for _, target in bounds)
    cells = sum(source * target for source, target in bounds)
    assert bounds[-1] == (0, 0) and tokens > 0
    server = start_server(
        [f"--model=luong={bundles['luong']}", "--max-request-tokens", str(2 * tokens),
         "--max-attention-cells", str(cells)],
        tmp_path / "log",
    )  # fmt: skip
    try:
        assert server.translate({"src": sentences, "beam_size": 2})[0] == 200
        status, answer = server.translate({"src": sentences, "beam_size": 3})
        assert status == 413 and f"up to {3 * tokens} tokens at beam_size 3" in answer["error"]
        assert (
            f"the limit is {2 * tokens} a request (seq2seq serve --max-request-tokens)"
            in (answer["error"])
        )
        assert server.translate({"src": sentences, "return_attention": True})[0] == 200
        status, answer = server.translate({"src": [*sentences, "w1"], "return_attention": True})
        assert status == 413 and "--max-attention-cells" in answer["error"]
        assert luong_count(server, "seq2seq_sentences_total") == 2 * len(sentences)
    finally:
        assert stop(server) == 0


def test_a_request_past_its_deadline_is_a_504_and_never_reaches_the_model(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """--request-timeout 0.5 while a request waits 3 s for others to join its batch: answered
    504 at its deadline, and dropped from the queue (the metrics say no sentence was
    translated and one dropped)."""
    server = start_server(
        [f"--model=luong={bundles['luong']}", "--max-wait-ms", "3000", "--request-timeout", "0.5"],
        tmp_path / "log",
    )  # fmt: skip
    try:
        began = time.monotonic()
        status, answer = server.translate({"src": ["w5 w6"]})
        assert status == 504 and "--request-timeout" in answer["error"]
        assert time.monotonic() - began < 2.5  # answered at its deadline, not after the batch
        deadline = time.monotonic() + 10
        while luong_count(server, "seq2seq_sentences_dropped_total") != 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert luong_count(server, "seq2seq_sentences_total") == 0
    finally:
        assert stop(server) == 0


def test_a_client_that_goes_away_is_dropped_before_the_model_and_logged(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """A client closes its connection while its request waits 3 s for others: the request is
    cancelled, never reaches the model (no sentence translated, one dropped) and is logged
    with status 499."""
    import socket

    server = start_server(
        [f"--model=luong={bundles['luong']}", "--max-wait-ms", "3000"], tmp_path / "log"
    )
    try:
        body = json.dumps({"src": ["w5 w6", "w7"]}).encode()
        client = socket.create_connection(("127.0.0.1", server.port))
        client.sendall(
            b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"X-Request-ID: gone-1\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_for_pending(server, 1)
        client.close()
        wait_for_pending(server, 0)  # cancelled once the server saw the connection close
        deadline = time.monotonic() + 10
        while luong_count(server, "seq2seq_sentences_dropped_total") != 2:
            assert time.monotonic() < deadline, server.log.read_text()[-3000:]
            time.sleep(0.05)
        assert luong_count(server, "seq2seq_sentences_total") == 0
        assert re.search(r"request gone-1: POST /translate -> 499 in \d", server.log.read_text())
        assert server.translate({"src": ["w5 w6"]})[0] == 200  # serving on
    finally:
        assert stop(server) == 0


def test_a_drain_cut_short_answers_503_and_exits_1(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """--drain-timeout 0.5 while a request waits 3 s for others: SIGTERM, and at the end of the
    drain the request is answered a JSON 503 with Retry-After; the exit status says so."""
    server = start_server(
        [f"--model=luong={bundles['luong']}", "--max-wait-ms", "3000", "--drain-timeout", "0.5"],
        tmp_path / "log",
    )  # fmt: skip
    answers: list[tuple[int, dict[str, str], bytes]] = []
    body = json.dumps({"src": ["w5 w6 w7"]}).encode()
    client = threading.Thread(
        target=lambda: answers.append(raw_request(server, "POST", "/translate", body))
    )
    client.start()
    wait_for_pending(server, 1)
    began = time.monotonic()
    assert stop(server) == 1
    client.join(timeout=60)
    [(status, headers, raw)] = answers
    assert status == 503 and headers["retry-after"] == "1"
    assert "--drain-timeout" in json.loads(raw)["error"]
    assert time.monotonic() - began < 2.5
    assert "the drain was cut short" in server.log.read_text()


def test_cors_origins_are_allowed_only_when_given(bundles: dict[str, Path]) -> None:
    """--cors-origin: a page of that origin may call the API from a browser (its preflight and
    its answers carry the origin); another origin, or a server without the option, gets no CORS
    header, so the browser keeps the answer from the page."""
    from fastapi.testclient import TestClient

    from seq2seq.serving.server import ModelSource, create_app

    course = "https://course.example.org"
    preflight = {"Origin": course, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}  # fmt: skip
    source = [ModelSource("luong", bundles["luong"])]
    with TestClient(create_app(source, cors_origins=(course,))) as client:
        allowed = client.options("/translate", headers=preflight)
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == course
        assert "POST" in allowed.headers["access-control-allow-methods"]
        other = client.options("/translate", headers={**preflight, "Origin": "https://evil.test"})
        assert "access-control-allow-origin" not in other.headers
        answer = client.get("/health/live", headers={"Origin": course})
        assert answer.headers["access-control-allow-origin"] == course
        assert "X-Request-ID" in answer.headers["access-control-expose-headers"]
    with TestClient(create_app(source)) as client:
        answer = client.get("/health/live", headers={"Origin": course})
        assert "access-control-allow-origin" not in answer.headers


def test_a_cors_origin_that_is_not_one_stops_the_server_with_a_message(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "scripts/serve.py", "--model", f"a={tmp_path}",
         "--cors-origin", "https://course.example.org/"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert completed.returncode == 2 and "is not an origin" in completed.stderr
    assert "Traceback" not in completed.stderr


def read_all(connection: Any, seconds: float) -> tuple[bytes, float]:
    """What the server sends on a raw socket until it closes it (or ``seconds`` pass), and when
    it closed it, counted from now."""
    began = time.monotonic()
    connection.settimeout(seconds)
    received = b""
    try:
        while chunk := connection.recv(65536):
            received += chunk
    except TimeoutError:
        pass
    return received, time.monotonic() - began


def test_slow_clients_and_too_many_connections_are_cut_off(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """--header-timeout: a client still sending its headers is disconnected; --body-timeout: one
    still sending its body gets a 408; --limit-concurrency: past it, a JSON 503, but for the
    liveness probe."""
    import socket

    server = start_server(
        [f"--model=luong={bundles['luong']}", "--header-timeout", "1", "--body-timeout", "1",
         "--limit-concurrency", "3"],
        tmp_path / "log",
    )  # fmt: skip
    address = ("127.0.0.1", server.port)
    try:
        slow_headers = socket.create_connection(address)
        slow_headers.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n")  # and no more
        received, seconds = read_all(slow_headers, 10)
        assert received == b"" and 0.5 < seconds < 5  # closed, not answered
        assert "its request headers took longer than 1 s" in server.log.read_text()

        # A kept-alive connection idle for longer than --header-timeout is the keep-alive
        # timeout's (5 s), not cut off as a slow sender: its next request is answered.
        kept = http.client.HTTPConnection(*address, timeout=10)
        kept.request("GET", "/health/live")
        assert kept.getresponse().read() == b'{"status":"alive"}'
        warnings = server.log.read_text().count("took longer than 1 s")
        time.sleep(1.5)
        kept.request("GET", "/health/live")
        assert kept.getresponse().status == 200
        kept.close()
        assert server.log.read_text().count("took longer than 1 s") == warnings

        slow_body = socket.create_connection(address)
        slow_body.sendall(
            b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"src": ['
        )
        received, seconds = read_all(slow_body, 10)
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and seconds < 5
        assert "--body-timeout" in json.loads(body)["error"]

        idle = [socket.create_connection(address) for _ in range(2)]
        assert raw_request(server, "GET", "/health/ready")[0] == 200  # 3 connections: served
        idle.append(socket.create_connection(address))
        status, headers, raw = raw_request(server, "GET", "/health/ready")
        assert status == 503 and headers["retry-after"] == "1" and "x-request-id" in headers
        assert json.loads(raw)["status"] == "busy"
        assert "--limit-concurrency" in json.loads(raw)["error"]
        status, _, raw = raw_request(server, "POST", "/translate", b'{"src": ["w1"]}')
        assert status == 503 and "--limit-concurrency" in json.loads(raw)["error"]
        # Each refusal logged once, by the app (just after its answer), with its id.
        deadline = time.monotonic() + 10
        while not re.search(r"request \w+: POST /translate -> 503 in", server.log.read_text()):
            assert time.monotonic() < deadline, server.log.read_text()[-3000:]
            time.sleep(0.05)
        assert "Exceeded concurrency limit" not in server.log.read_text()
        metrics = scrape(server)  # answered past the limit, and counting the refusals
        assert metrics[("seq2seq_requests_total", (("method", "POST"), ("route", "/translate"),
                                                   ("status", "503")))] == 1  # fmt: skip
        # A busy server is alive: its liveness probe passes, so it is not restarted for it.
        status, _, raw = raw_request(server, "GET", "/health/live")
        assert (status, json.loads(raw)) == (200, {"status": "alive"})
        assert raw_request(server, "HEAD", "/health/live")[::2] == (200, b"")
        for connection in [slow_headers, slow_body, *idle]:
            connection.close()
        deadline = time.monotonic() + 10
        while raw_request(server, "GET", "/health/ready")[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert server.translate({"src": ["w5 w6"]})[0] == 200
    finally:
        assert stop(server) == 0


def test_schemathesis_finds_nothing_in_the_servers_own_schema(
    server: Server, tmp_path: Path
) -> None:
    """Schemathesis (a tool we did not write) reads GET /openapi.json, generates valid and
    invalid requests for every operation (a bounded number, a fixed seed) and checks every
    answer against the schema: status codes, content types, bodies, Allow headers, valid data
    accepted, invalid data refused, never a 5xx. Strings are UTF-8, as the server's bodies are."""
    program = Path(sys.executable).parent / "st"
    if not program.is_file():
        pytest.skip("schemathesis is not installed (pip install .[dev])")
    completed = subprocess.run(
        [str(program), "run", f"http://127.0.0.1:{server.port}/openapi.json", "--checks", "all",
         "--max-examples", "25", "--seed", "1", "--generation-codec", "utf-8", "--no-color"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-6000:]
    assert " passed" in completed.stdout and "failure" not in completed.stdout.lower()


def test_the_schema_describes_every_route_and_its_errors(server: Server) -> None:
    """GET /openapi.json: a request body for each POST, a response schema for each answer, the
    {"error"} shape for every 4xx/5xx of the routes that refuse, GET / as HTML; /docs is off
    (FastAPI's pages load their scripts from a CDN)."""
    status, schema = server.request("GET", "/openapi.json")
    assert status == 200
    paths = schema["paths"]
    routes = {f"{method.upper()} {path}" for path, ops in paths.items() for method in ops}
    assert set(ROUTES) <= routes
    translate = paths["/translate"]["post"]
    body = translate["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["src"]["maxItems"] == 8
    assert body["properties"]["beam_size"]["maximum"] == 6
    assert body["properties"]["model"]["enum"] == ["luong", "transformer"]
    error = {"$ref": "#/components/schemas/ErrorAnswer"}
    for code in ("400", "404", "413", "422", "500", "503", "504"):
        assert translate["responses"][code]["content"]["application/json"]["schema"] == error
    assert "text/html" in paths["/"]["get"]["responses"]["200"]["content"]
    assert server.request("GET", "/docs")[0] == 404


def test_broken_http_disconnects_and_odd_requests_answer_json(server: Server) -> None:
    """Malformed HTTP (uvicorn's own 400) is JSON too; a client that leaves mid-body is a 499,
    not a 500; a key given twice is refused; /translate/ is a 404, not a redirect; invented
    methods are counted under one label, so that they cannot grow /metrics."""
    import socket

    for raw in [b"NOT HTTP AT ALL\r\n\r\n",
                b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"]:  # fmt: skip
        connection = socket.create_connection(("127.0.0.1", server.port))
        connection.sendall(raw)
        received, _ = read_all(connection, 10)
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
        assert "not valid HTTP/1.1" in json.loads(body)["error"]

    leaving = socket.create_connection(("127.0.0.1", server.port))
    leaving.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nX-Request-ID: midbody-1\r\n"
                    b'Content-Length: 100\r\n\r\n{"src":')  # fmt: skip
    leaving.shutdown(socket.SHUT_WR)
    leaving.close()
    deadline = time.monotonic() + 10
    while "request midbody-1" not in server.log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "request midbody-1: POST /translate -> 499" in server.log.read_text()
    assert "ClientDisconnect" not in server.log.read_text()

    status, answer = server.request("POST", "/translate", b'{"src": ["w1"], "src": ["w2"]}')
    assert status == 422 and answer["error"].startswith("src: the key appears twice")
    status, answer = server.request("POST", "/translate/", b'{"src": ["w1"]}')
    assert status == 404 and "no route /translate/" in answer["error"]

    for index in range(5):
        assert raw_request(server, f"X{index:05d}", "/health")[0] == 405
    methods = {labels[0][1] for (name, labels) in scrape(server)
               if name == "seq2seq_requests_total" and labels}  # fmt: skip
    assert "other" in methods and not any(method.startswith("X0") for method in methods)


def test_a_body_that_is_not_json_by_its_content_type_is_a_415(server: Server) -> None:
    """A browser page of another origin may POST text/plain or a form without a CORS preflight:
    such bodies are refused, naming the header; JSON types (with parameters, or ``+json``) and
    no Content-Type at all are read as JSON, as FastAPI reads them."""
    payload = json.dumps({"model": "luong", "src": ["w1 w2"]}).encode()
    refusals = ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                "application/json; charset=latin-1"]  # fmt: skip
    for refused in refusals:
        for path in ["/translate", "/explore"]:
            body = payload if path == "/translate" else b'{"src": "w1 w2"}'
            status, answer = server.request("POST", path, body, {"Content-Type": refused})
            assert status == 415 and f"Content-Type {refused!r}" in answer["error"]
            assert "application/json" in answer["error"]
    for accepted in ["application/json; charset=utf-8", "Application/JSON", "application/x+json"]:
        assert server.request("POST", "/translate", payload, {"Content-Type": accepted})[0] == 200
    assert server.request("POST", "/translate", payload)[0] == 200  # none


def test_a_large_request_takes_turns_with_a_small_one(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """--max-batch-tokens: a request of eight long sentences goes through the model two at a
    time, and a one-sentence request sent after it started is answered before it ends, each
    with its own translations (those of the translator)."""
    long = [" ".join(f"w{(i + k) % 40 + 1}" for k in range(20)) for i in range(8)]
    translator = Translator.load(bundles["luong"])
    limit = translator.bounds(long[:1])[0][1]
    server = start_server(
        [f"--model=luong={bundles['luong']}", "--max-batch-tokens", str(2 * limit)],
        tmp_path / "log",
    )
    finished: dict[str, tuple[float, Any]] = {}

    def send(name: str, sentences: list[str]) -> None:
        answer = server.translate({"src": sentences})
        finished[name] = (time.monotonic(), answer)

    try:
        large = threading.Thread(target=send, args=("large", long))
        large.start()
        wait_for_pending(server, 1)
        send("small", ["w5 w6"])
        large.join(timeout=60)
        assert finished["small"][0] < finished["large"][0]
        for name, sentences in [("large", long), ("small", ["w5 w6"])]:
            status, answer = finished[name][1]
            assert status == 200
            assert [r["tgt"] for r in answer["results"]] == translator.translate(sentences)
        batches = scrape(server)[("seq2seq_batch_sentences_count", (("model", "luong"),))]
        assert batches >= 5  # 8 sentences, 2 a batch, and the small request
    finally:
        assert stop(server) == 0


def test_a_client_that_does_not_read_its_answer_is_cut_off(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """--write-timeout 1: a client that asks for megabytes of attention and reads none of them
    (its receive window kept small) has its connection aborted, the answer's unsent bytes freed,
    and the server serves on."""
    import socket

    server = start_server(
        [f"--model=luong={bundles['luong']}", "--write-timeout", "1",
         "--max-request-tokens", "1000000", "--max-attention-cells", "100000000"],
        tmp_path / "log",
    )  # fmt: skip
    try:
        # 64 sentences of 256 tokens (the model's max_src_len): megabytes of weights, more than
        # the kernel's socket buffers take.
        sentences = [" ".join(f"w{(i + k) % 40 + 1}" for k in range(256)) for i in range(64)]
        body = json.dumps({"src": sentences, "return_attention": True}).encode()
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", server.port))
        client.sendall(
            b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 60
        while "read nothing of its answer for 1 s" not in server.log.read_text():
            assert time.monotonic() < deadline, server.log.read_text()[-3000:]
            time.sleep(0.1)
        # What the kernel's buffers held reaches the client, then the connection ends, short of
        # the length the answer announced.
        received, seconds = read_all(client, 10)
        client.close()
        head, _, answer = received.partition(b"\r\n\r\n")
        length = re.search(rb"content-length: (\d+)", head.lower())
        assert head.startswith(b"HTTP/1.1 200") and length and seconds < 5
        assert len(answer) < int(length.group(1))
        assert server.translate({"src": ["w5 w6"]})[0] == 200
    finally:
        assert stop(server) == 0


def test_explore_past_its_deadline_is_a_504_and_its_work_is_dropped(
    bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """/explore has /translate's deadline: a sentence whose explorer data takes longer is a 504,
    and one queued behind it in the model's thread is dropped there, never run."""
    from fastapi.testclient import TestClient

    from seq2seq.serving import server as serving
    from seq2seq.serving.server import Limits, ModelSource, create_app

    calls: list[str] = []
    real = serving.explorer_data

    def slow(models: Any, sentences: list[str]) -> Any:
        calls.append(sentences[0])
        time.sleep(1.5)
        return real(models, sentences)

    monkeypatch.setattr(serving, "explorer_data", slow)
    app = create_app([ModelSource("luong", bundles["luong"])], Limits(request_timeout=0.5))
    with TestClient(app) as client:
        deadline = time.monotonic() + 60
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        answers: list[Any] = []
        first = threading.Thread(
            target=lambda: answers.append(client.post("/explore", json={"src": "w1 w2"}))
        )
        first.start()
        while not calls:  # the first sentence is in the model's thread, for 1.5 s
            time.sleep(0.01)
        began = time.monotonic()
        second = client.post("/explore", json={"src": "w3 w4"})
        assert second.status_code == 504 and "--request-timeout" in second.json()["error"]
        assert time.monotonic() - began < 1.2
        first.join(timeout=30)
        assert answers[0].status_code == 504
        time.sleep(2)  # the first is done: the second would have run by now
        assert calls == ["w1 w2"]


def test_explore_has_the_limits_and_the_line_of_translate(
    bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """/explore within --max-request-tokens (the sentence decoded and teacher-forced) and
    --max-attention-cells (every map it returns, seq2seq.explorer.data.view_cells), a 413
    past either; it waits in the model's line (a 503 when the line is full) and is counted in
    the model's metrics like a translation."""
    from fastapi.testclient import TestClient

    from seq2seq.explorer.data import view_cells
    from seq2seq.serving import server as serving
    from seq2seq.serving.server import Limits, ModelSource, create_app

    translator = Translator.load(bundles["transformer"])
    [(source, target)] = translator.bounds(["w1 w2 w3"])
    cells = view_cells(translator, source, target)
    assert cells > 4 * source * target  # every head and both self-attentions count
    transformer = [ModelSource("transformer", bundles["transformer"])]

    def client_for(limits: Limits) -> TestClient:
        return TestClient(create_app(transformer, limits))

    def when_ready(client: TestClient) -> None:
        deadline = time.monotonic() + 60
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)

    for limits, status, message in [
        (Limits(max_request_tokens=2 * target, max_attention_cells=cells), 200, None),
        (Limits(max_request_tokens=2 * target - 1), 413, "--max-request-tokens"),
        (Limits(max_attention_cells=cells - 1), 413, "--max-attention-cells"),
    ]:
        with client_for(limits) as client:
            when_ready(client)
            answer = client.post("/explore", json={"src": "w1 w2 w3"})
            assert answer.status_code == status, answer.text[:300]
            if message is not None:
                assert message in answer.json()["error"]
            else:
                metrics = client.get("/metrics").text
                assert 'seq2seq_sentences_total{model="transformer"} 1.0' in metrics

    started = threading.Event()
    real = serving.explorer_data

    def slow(models: Any, sentences: list[str]) -> Any:
        started.set()
        time.sleep(1)
        return real(models, sentences)

    monkeypatch.setattr(serving, "explorer_data", slow)
    with client_for(Limits(max_queue=1)) as client:
        when_ready(client)
        answers: list[Any] = []
        first = threading.Thread(
            target=lambda: answers.append(client.post("/explore", json={"src": "w1"}))
        )
        first.start()
        assert started.wait(30)
        busy = client.post("/explore", json={"src": "w2"})
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert "--max-queue 1" in busy.json()["error"]
        first.join(timeout=30)
        assert answers[0].status_code == 200


def test_sigterm_while_a_body_arrives_answers_503_and_exits_1(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """A client still sending its body when the drain time runs out gets the drain's JSON 503,
    not a 500, and the exit status says the drain was cut short."""
    import socket

    server = start_server(
        [f"--model=luong={bundles['luong']}", "--drain-timeout", "0.5", "--body-timeout", "30"],
        tmp_path / "log",
    )  # fmt: skip
    client = socket.create_connection(("127.0.0.1", server.port))
    client.sendall(
        b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"src": ['
    )
    time.sleep(0.3)  # the request is in the app, reading its body
    assert stop(server) == 1
    received, _ = read_all(client, 10)
    client.close()
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower()
    assert "--drain-timeout" in json.loads(body)["error"]
    log = server.log.read_text()
    assert "the drain was cut short" in log and "Traceback" not in log
