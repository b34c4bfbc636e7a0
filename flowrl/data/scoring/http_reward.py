"""A reward server over HTTP: `data.reward=http://host:port/path`.

Responses are sent in batches, several batches at once, as
POST {"samples": [{"data_source", "solution_str", "ground_truth", "extra_info"}, ...]}
and the server answers {"scores": [float, ...]} in the same order. A batch
that fails (connection error, timeout, HTTP 5xx) is retried with backoff; when
every attempt fails, or the answer is malformed, the run stops with one line
naming the URL and the first row of the batch. Each attempt ends within
data.reward_timeout_s in all (a server trickling bytes included), and a
redirect is refused, never followed. Errors show the URL without its
password or token (flowrl.data.redact).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flowrl.data.scoring.pool import Sample, check_reward
from flowrl.data.redact import redact


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: the samples go to the server named in data.reward, nowhere else."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, f"a redirect to {newurl}, not followed (flowrl follows no "
                                     f"redirect: set data.reward to the server's own URL)", headers, fp)


_OPENER = urllib.request.build_opener(_NoRedirect)


def _read_by(answer: Any, deadline: float) -> bytes:
    """The whole body by `deadline` (urlopen's timeout bounds each read, so a server trickling bytes could
    hold a batch for ever): a TimeoutError past it."""
    parts = []
    while chunk := answer.read1(1 << 16):
        parts.append(chunk)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the answer took longer than data.reward_timeout_s (trickling: {sum(map(len, parts))} "
                               f"bytes so far)")
    return b"".join(parts)


class HttpScorer:
    def __init__(self, url: str, timeout_s: float = 10.0, num_parallel: int = 4, batch_size: int = 64,
                 attempts: int = 3, backoff_s: float = 0.5):
        self.url, self.timeout_s, self.batch_size = url, timeout_s, batch_size
        self.shown_url = redact(url)  # what errors say: no token or password
        self.num_parallel, self.attempts, self.backoff_s = max(1, num_parallel), attempts, backoff_s

    def score(self, samples: list[Sample]) -> list[float]:
        chunks = [samples[i:i + self.batch_size] for i in range(0, len(samples), self.batch_size)]
        with ThreadPoolExecutor(self.num_parallel) as threads:
            return [score for chunk in threads.map(self._post, chunks) for score in chunk]

    def _post(self, chunk: list[Sample]) -> list[float]:
        body = json.dumps({"samples": [{"data_source": s.data_source, "solution_str": s.response,
                                        "ground_truth": s.ground_truth, "extra_info": s.extra_info}
                                       for s in chunk]}).encode()
        last: Exception | None = None
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
            try:
                with _OPENER.open(request, timeout=self.timeout_s) as answer:
                    return self._scores(json.loads(_read_by(answer, time.monotonic() + self.timeout_s)), chunk)
            except urllib.error.HTTPError as err:
                if err.code < 500:  # the server refused this batch (or redirected it): retrying will not help
                    raise self._error(chunk, f"HTTP {err.code} {redact(str(err.reason))}") from None
                last = err
            except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
                last = err
        raise self._error(chunk, f"{self.attempts} attempts failed, the last with {type(last).__name__}: {last}")

    def _scores(self, answer: Any, chunk: list[Sample]) -> list[float]:
        scores = answer.get("scores") if isinstance(answer, dict) else None
        if not isinstance(scores, list) or len(scores) != len(chunk):
            raise self._error(chunk, f"expected {{\"scores\": [{len(chunk)} numbers]}}, got {str(answer)[:80]}")
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scores):
            raise self._error(chunk, f"expected numbers, got {str(scores)[:80]}")
        return [check_reward(float(s), f"{sample.where} from reward server {self.shown_url}")
                for s, sample in zip(scores, chunk)]

    def _error(self, chunk: list[Sample], what: str) -> ValueError:
        return ValueError(f"data.reward: reward server {self.shown_url} failed on the batch from {chunk[0].where}: {what}")

    def close(self) -> None:
        pass
