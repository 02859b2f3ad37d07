"""The messages the append benchmark sends and the token-counting corpus: English prose, code, Chinese."""

from __future__ import annotations

import random

PROSE = [
    "Can you check why the nightly export failed again?",
    "The job stopped after the third batch with a timeout from the storage service.",
    "I looked at the logs and the retry policy gave up after five attempts.",
    "Let me summarise what we know so far before we change anything.",
    "The customer wants the report by Friday, so we should keep the fix small.",
    "Here is the plan: reproduce the failure locally, add a test, then patch the client.",
    "The connection pool was exhausted because every worker opened its own session.",
    "That explains the spikes in latency we saw on Tuesday afternoon.",
    "Please keep the answer short and list the steps in order.",
    "I would rather not touch the database schema in the same change.",
    "The migration adds a nullable column first and backfills it in a second step.",
    "Our agent keeps the last twenty turns and a summary of everything older.",
    "When the context grows past the budget, the oldest turns are compacted into a summary.",
    "Could you draft an email to the team explaining the outage in plain language?",
    "The root cause was a configuration change that doubled the number of open files.",
    "We rolled back at 14:05 and the error rate returned to normal within minutes.",
    "I am not sure the cache is invalidated when a tenant changes its default model.",
    "Good question; the cache key includes the model name, so a change misses the old entry.",
    "Thanks, that works. Now the tests pass on both PostgreSQL and SQLite.",
    "Next, I would like to measure how many messages per second the service can store.",
    "The benchmark should run with one command and print a table we can paste into the README.",
    "Make sure the numbers are compared with a baseline measured in the same run.",
    "The dashboard shows p99 latency, which matters more than the average for our users.",
    "It looks like the slow requests all touch the same conversation at once.",
    "A row lock on the conversation serialises the writers, which is what keeps the order strict.",
    "Let me know if you want me to open a ticket for the follow-up work.",
    "I searched the documentation but could not find how the idempotency key is scoped.",
    "The key is unique per conversation, so a retry of the same request returns the original message.",
    "Sure. I will start with the failing case and then widen the test to cover batches.",
    "The product team asked whether we can keep transcripts for ninety days by default.",
    "That depends on the tenant's retention setting, which overrides the default.",
    "Remember that the summary must never drop a decision the user made earlier.",
    "I will read the design document again and come back with questions tomorrow.",
    "The model answered in French although the user wrote in English; we should pin the language.",
    "Could you rewrite this paragraph so a new engineer understands it on the first read?",
    "We can ship the change behind a flag and turn it on for one tenant first.",
]


CODE = [
    "def retry(fn, attempts=5, delay=0.5):\n    for i in range(attempts):\n        try:\n"
    "            return fn()\n        except TimeoutError:\n            time.sleep(delay * 2**i)\n"
    "    raise RuntimeError('gave up')",
    "SELECT c.id, count(m.id) AS n\nFROM conversations_conversation c\n"
    "JOIN conversations_message m ON m.conversation_id = c.id\nGROUP BY c.id\nORDER BY n DESC\nLIMIT 10;",
    "const res = await fetch(`/api/v1/conversations/${id}/messages`, {\n  method: 'POST',\n"
    "  headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key },\n"
    "  body: JSON.stringify({ role: 'user', content }),\n});\n"
    "if (!res.ok) throw new Error(await res.text());",
    "class Pool:\n    def __init__(self, size: int) -> None:\n        self._free = list(range(size))\n\n"
    "    def acquire(self) -> int:\n        if not self._free:\n"
    "            raise LookupError('pool exhausted')\n"
    "        return self._free.pop()",
    "$ kubectl logs deploy/export-worker --since=1h | grep -c Timeout\n42\n"
    "$ kubectl rollout undo deploy/export-worker",
    "for (const msg of history.slice(-20)) {\n  tokens += countTokens(msg.content) + 3;\n}\n"
    "if (tokens > budget) compact(history);",
]


CHINESE = [
    "请帮我看一下为什么昨晚的导出任务又失败了。",
    "日志显示第三批数据之后存储服务超时，重试五次后放弃。",
    "我们应该先在本地复现这个问题，再写一个测试。",
    "客户希望周五之前拿到报告，所以修改要尽量小。",
    "连接池被耗尽了，因为每个进程都打开了自己的会话。",
    "上下文超过预算时，最早的对话轮次会被压缩成摘要。",
    "摘要绝不能丢掉用户之前做出的决定。",
    "请用简单的语言给团队写一封说明这次故障的邮件。",
    "回滚之后，错误率在几分钟内恢复正常。",
    "这个幂等键在每个会话内唯一，重试会返回原来的消息。",
    "好的，我先处理失败的情况，然后把测试扩展到批量请求。",
    "模型用法语回答了英文问题，我们需要固定输出语言。",
]


def words_of_prose(rng: random.Random, n_words: int) -> str:
    words: list[str] = []
    while len(words) < n_words:
        words.extend(rng.choice(PROSE).split())
    return " ".join(words[:n_words])


def chat_message(rng: random.Random, role: str) -> str:
    """A user or assistant message of 20-200 words; an assistant answer sometimes carries a code block."""
    n_words = rng.randint(20, 200)
    if role == "assistant" and n_words > 60 and rng.random() < 0.3:
        code = rng.choice(CODE)
        prose_words = max(20, n_words - len(code.split()))
        return f"{words_of_prose(rng, prose_words)}\n\n```\n{code}\n```"
    return words_of_prose(rng, n_words)


def token_corpus(rng: random.Random, size: int) -> list[tuple[str, str]]:
    """(role, content) pairs: mostly English prose, a quarter with code, some Chinese and some mixed."""
    corpus = []
    for i in range(size):
        role = "user" if i % 2 == 0 else "assistant"
        pick = rng.random()
        if pick < 0.55:
            content = words_of_prose(rng, rng.randint(20, 300))
        elif pick < 0.80:
            content = f"{words_of_prose(rng, rng.randint(10, 80))}\n\n```\n{rng.choice(CODE)}\n```"
        elif pick < 0.95:
            content = "".join(rng.choice(CHINESE) for _ in range(rng.randint(2, 20)))
        else:
            content = f"{''.join(rng.choice(CHINESE) for _ in range(3))} {words_of_prose(rng, 40)}"
        corpus.append((role, content))
    return corpus
