"""Asking every question through the context endpoint, and the data set's own baselines on the
same questions."""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path
from typing import Any

from bench._common import log
from bench._evidence.api import Api, ApiError
from bench._evidence.dataset import Dataset
from bench._evidence.scoring import Prompt, words


def call_figures(response: dict[str, Any], ms: float) -> dict[str, Any]:
    b5 = (response.get("blocks") or {}).get("B5") or {}
    scores = [i["score"] for i in b5.get("items") or [] if isinstance(i.get("score"), int | float)]
    timings = response.get("timings") or {}
    return {
        "latency_ms": round(ms, 2),
        "server_ms": round(sum(v for v in timings.values() if isinstance(v, int | float)), 3),
        "timings": timings,
        "tokens_total": (response.get("tokens") or {}).get("total"),
        "b5_tokens": b5.get("tokens", 0),
        "b5_scores": scores,
        "degradations": [d.get("code") for d in response.get("degradations") or []],
        "dropped": [
            {k: d.get(k) for k in ("block", "reason", "tokens")} for d in response.get("dropped") or []
        ],
    }


def evidence_found(response: dict[str, Any], row: dict[str, Any], message_words: Any) -> dict[str, Any]:
    prompt = Prompt.of(response)
    present = [s for s in row["evidence_seqs"] if prompt.holds(message_words(s))]
    er = len(present) / len(row["evidence_seqs"]) if row["scored"] and row["evidence_seqs"] else None
    return {"present_seqs": present, "er": er}


def ask_one(
    api: Api, conversation_id: str, question: dict[str, Any], budget: int, message_words: Any
) -> dict:
    row = {
        "id": question["id"],
        "category": question["category"],
        "budget": budget,
        "scored": bool(question.get("scored")),
        "evidence_seqs": list(question.get("evidence_seqs") or []),
    }
    body = {"user_message": question["question"], "token_budget": budget, "format": "openai"}
    try:
        response, ms = api.call("POST", f"/conversations/{conversation_id}/context", body)
    except ApiError as exc:  # recorded and counted; a dead server (transport error) stops the run
        log(f"  {question['id']} @ {budget}: {exc}")
        return {**row, "error": str(exc), "present_seqs": [], "er": 0.0 if row["scored"] else None}
    return {**row, **call_figures(response, ms), **evidence_found(response, row, message_words)}


def ask_all(api: Api, dataset: Dataset, budgets: list[int], manifest: dict[str, Any]) -> list[dict]:
    rows: list[dict[str, Any]] = []
    for conversation in dataset.conversations:
        texts = {m["seq"]: m["content"] for m in conversation["messages"]}
        cache: dict[int, list[str]] = {}

        def message_words(seq: int, texts: dict = texts, cache: dict = cache) -> list[str]:
            if seq not in cache:
                cache[seq] = words(texts.get(seq, ""))
            return cache[seq]

        for budget in budgets:
            conversation_id = manifest["conversations"][conversation["id"]][str(budget)]
            asked = [
                ask_one(api, conversation_id, q, budget, message_words) for q in conversation["questions"]
            ]
            for row in asked:
                row["conversation"] = conversation["id"]
            rows += asked
            ers = [r["er"] for r in asked if r["er"] is not None]
            er = f"{statistics.fmean(ers):.3f}" if ers else "-"
            log(f"  asked {conversation['id']} @ {budget}: {len(asked)} questions, ER {er}")
    return rows


def baselines(path: Path, dataset: Dataset, budgets: list[int]) -> tuple[Any, Any, int]:
    """The dataset's own recency / BM25 / oracle, on exactly the questions Mnemo is scored on."""
    spec = importlib.util.spec_from_file_location("dataset_baselines", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _, count = module.make_counter("chars")  # len/4
    scored = [
        {**c, "questions": [q for q in c["questions"] if q.get("scored")]} for c in dataset.conversations
    ]
    er, full, _ = module.run(scored, list(budgets), count)
    n = sum(len(v) for v in er["bm25"][budgets[0]].values())
    return er, full, n
