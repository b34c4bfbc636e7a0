"""The reward server over HTTP, against a local server this test starts: batches, retries, errors."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flowrl.config import load_run_config
from flowrl.data.scoring.http_reward import HttpScorer
from flowrl.data.scoring.pool import Sample
from flowrl.runtime.data_tasks import run_task


@pytest.fixture
def server():
    """Scores len(solution_str); the first `fail_first` requests get HTTP 503; records batch sizes."""
    state = {"fail_first": 0, "batches": [], "status": 200}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            samples = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["samples"]
            if state["fail_first"] > 0 or state["status"] != 200:
                state["fail_first"] -= 1
                self.send_error(state["status"] if state["status"] != 200 else 503)
                return
            state["batches"].append(len(samples))
            body = json.dumps({"scores": [len(s["solution_str"]) + s["extra_info"]["bonus"] for s in samples]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/score", state
    httpd.shutdown()


def samples(texts):
    return [Sample("", "src", t, "", {"bonus": 1}, f"t.parquet row {i}") for i, t in enumerate(texts)]


def test_batches_in_order_and_retries_a_failing_server(server):
    url, state = server
    scorer = HttpScorer(url, num_parallel=2, batch_size=2, backoff_s=0.01)
    state["fail_first"] = 2  # two 503s: those batches succeed on a later attempt
    assert scorer.score(samples(["a", "bb", "", "cccc", "ddd"])) == [2.0, 3.0, 1.0, 5.0, 4.0]
    assert sorted(state["batches"]) == [1, 2, 2]


def test_a_refused_or_unreachable_server_is_one_line(server):
    url, state = server
    state["status"] = 400
    with pytest.raises(ValueError, match=rf"data.reward: reward server {url} failed on the batch from "
                                         r"t.parquet row 0: HTTP 400"):
        HttpScorer(url, backoff_s=0.01).score(samples(["a"]))
    dead = "http://127.0.0.1:9/score"  # the discard port: nothing listens
    with pytest.raises(ValueError, match=r"failed on the batch from t.parquet row 0: 2 attempts failed, the last with"):
        HttpScorer(dead, attempts=2, backoff_s=0.01, timeout_s=2).score(samples(["a"]))


def test_data_reward_url_scores_every_row_with_the_server(server, tmp_path):
    url, _ = server
    row = {"data_source": "my/source", "prompt": "1+1=", "reward_model": {"ground_truth": "2"},
           "extra_info": {"bonus": 10}}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(row) + "\n")
    task = run_task(load_run_config(None, [f"data.train_files={path}", f"data.reward={url}"]))
    _, meta = task.example(0, 0)
    assert task.reward(["abc"], [meta]) == [13.0]  # len("abc") + bonus 10
