"""The engine host's OpenAI API through the `openai` Python package (deploy/checks/openai_client.sh).

Usage: openai_client.py BASE_URL   (e.g. http://127.0.0.1:8000/v1)

Each check prints one line (`ok NAME: ...` or `FAIL NAME: ...`); any failure exits 1. The checks
hold for any served model: texts are compared with each other (greedy vs streamed, one seed vs
another), never with fixed strings, and a finish may be "stop" (an end-of-sequence token) where
"length" is the rule for a model without one.
"""

import sys
import traceback

import openai

BASE = sys.argv[1]
client = openai.OpenAI(base_url=BASE, api_key="unused", timeout=120, max_retries=0)
failures = []


def check(name):
    def run(fn):
        try:
            detail = fn()
            print(f"ok {name}: {detail}")
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the next runs
            failures.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=3, file=sys.stderr)
        return fn

    return run


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


MODEL = None


@check("models.list / models.retrieve")
def _():
    global MODEL
    ids = [m.id for m in client.models.list().data]
    expect(len(ids) == 1, f"one served model, got {ids}")
    MODEL = ids[0]
    m = client.models.retrieve(MODEL)
    expect(m.id == MODEL and m.object == "model", f"retrieve: {m}")
    return f"serves {MODEL}"


PROMPT = "The cache remembers what the model read"


def greedy(prompt, max_tokens=8, **kw):
    return client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, **kw
    )


@check("completions: a text prompt")
def _():
    r = greedy(PROMPT)
    c = r.choices[0]
    expect(r.object == "text_completion" and r.id.startswith("cmpl-"), f"{r.object} {r.id}")
    expect(r.created > 0, "created")
    expect(c.finish_reason in ("length", "stop"), f"finish_reason {c.finish_reason}")
    expect(r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 8, f"usage {r.usage}")
    expect(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "total")
    again = greedy(PROMPT)
    expect(again.choices[0].text == c.text, "greedy is deterministic")
    expect(again.id != r.id, "ids differ")
    return f"{c.text!r} ({c.finish_reason}, {r.usage.completion_tokens} tokens)"


@check("completions: token ids")
def _():
    r = greedy([1, 2, 3, 4, 5], max_tokens=4)
    expect(r.usage.prompt_tokens == 5, f"usage {r.usage}")
    return f"{r.choices[0].text!r}"


@check("completions: a batch of prompts")
def _():
    r = greedy(["first prompt", "second prompt"], max_tokens=4)
    expect([c.index for c in r.choices] == [0, 1], f"indices {[c.index for c in r.choices]}")
    expect(r.choices[0].text == greedy("first prompt", max_tokens=4).choices[0].text, "choice 0")
    expect(r.choices[1].text == greedy("second prompt", max_tokens=4).choices[0].text, "choice 1")
    r = greedy([[1, 2, 3], [4, 5, 6]], max_tokens=2, n=2)
    expect(sorted(c.index for c in r.choices) == [0, 1, 2, 3], "prompt x n indices")
    return "2 prompts -> 2 choices; 2 token lists x n=2 -> 4"


@check("completions: n=2")
def _():
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, n=2, seed=3)
    expect(sorted(c.index for c in r.choices) == [0, 1], f"{r.choices}")
    return f"{[c.text for c in r.choices]}"


@check("completions: stop")
def _():
    full = greedy(PROMPT, max_tokens=12).choices[0].text
    expect(len(full) >= 4, f"a long enough greedy text: {full!r}")
    stop = full[2:4]
    r = greedy(PROMPT, max_tokens=12, stop=[stop])
    c = r.choices[0]
    expect(c.text == full[: full.find(stop)], f"{c.text!r} is {full!r} cut before {stop!r}")
    expect(c.finish_reason == "stop", f"finish_reason {c.finish_reason}")
    return f"{full!r} stopped at {stop!r}: {c.text!r}"


@check("completions: seed reproducibility at temperature 1")
def _():
    def sample(seed):
        return client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1, seed=seed
        ).choices[0].text

    a, b = sample(11), sample(11)
    expect(a == b, f"same seed, same text: {a!r} vs {b!r}")
    others = [sample(s) for s in (12, 13, 14)]
    expect(any(o != a for o in others), f"other seeds give other texts: {a!r} {others}")
    return f"seed 11 -> {a!r} twice; seed 12 -> {others[0]!r}"


@check("completions: logprobs")
def _():
    r = greedy(PROMPT, max_tokens=4, logprobs=2)
    lp = r.choices[0].logprobs
    expect(len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset), "aligned lists")
    expect(len(lp.tokens) >= 1, "tokens")
    expect(all(v <= 0 for v in lp.token_logprobs), f"log-probabilities: {lp.token_logprobs}")
    expect(all(1 <= len(t) <= 2 for t in lp.top_logprobs), f"top 2: {lp.top_logprobs}")
    return f"{lp.tokens} {lp.token_logprobs}"


@check("completions: echo")
def _():
    r = greedy(PROMPT, max_tokens=4, echo=True)
    plain = greedy(PROMPT, max_tokens=4).choices[0].text
    expect(r.choices[0].text == PROMPT + plain, f"{r.choices[0].text!r}")
    return f"{r.choices[0].text!r}"


@check("completions: stream with include_usage")
def _():
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )
    expect(all(c.created > 0 for c in chunks), "created on every chunk")
    expect(len({c.id for c in chunks}) == 1, "one id")
    last = chunks[-1]
    expect(last.choices == [] and last.usage is not None, f"usage chunk last: {last}")
    expect(all(c.usage is None for c in chunks[:-1]), "usage only in the last chunk")
    text = "".join(ch.text for c in chunks for ch in c.choices)
    want = greedy(PROMPT, max_tokens=8).choices[0].text
    expect(text == want, f"streamed {text!r} == {want!r}")
    reasons = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    expect(len(reasons) == 1, f"one finish: {reasons}")
    plain = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, stream=True))
    expect(all(c.usage is None for c in plain), "no usage unless asked")
    return f"{len(chunks)} chunks, usage {last.usage.completion_tokens} tokens"


MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say something about caches."},
]


def chat(**kw):
    return client.chat.completions.create(model=MODEL, messages=MESSAGES, **kw)


@check("chat: plain")
def _():
    r = chat(max_tokens=8, temperature=0)
    c = r.choices[0]
    expect(r.object == "chat.completion" and r.id.startswith("chatcmpl-"), f"{r.object} {r.id}")
    expect(c.message.role == "assistant" and isinstance(c.message.content, str), f"{c.message}")
    expect(c.finish_reason in ("length", "stop"), f"finish_reason {c.finish_reason}")
    expect(r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, f"usage {r.usage}")
    parts = client.chat.completions.create(
        model=MODEL, max_completion_tokens=8, temperature=0,
        messages=[MESSAGES[0], {"role": "user", "content": [{"type": "text", "text": "Say something "}, {"type": "text", "text": "about caches."}]}],
    )
    expect(parts.choices[0].message.content == c.message.content, "text parts join")
    return f"{c.message.content!r} ({c.finish_reason})"


@check("chat: streaming")
def _():
    chunks = list(
        chat(max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True})
    )
    expect(chunks[0].choices[0].delta.role == "assistant", f"first delta {chunks[0]}")
    expect(all(c.object == "chat.completion.chunk" and c.created > 0 for c in chunks), "shape")
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    want = chat(max_tokens=8, temperature=0).choices[0].message.content
    expect(text == want, f"streamed {text!r} == {want!r}")
    reasons = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    expect(len(reasons) == 1 and reasons[0] in ("length", "stop"), f"finish {reasons}")
    expect(chunks[-1].choices == [] and chunks[-1].usage is not None, "usage chunk")
    return f"{len(chunks)} chunks: {text!r}"


@check("chat: n=2")
def _():
    r = chat(max_tokens=4, n=2, seed=5)
    expect(sorted(c.index for c in r.choices) == [0, 1], f"{r.choices}")
    return f"{[c.message.content for c in r.choices]}"


@check("chat: logprobs")
def _():
    r = chat(max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    expect(len(content) >= 1, "entries")
    expect(all(e.logprob <= 0 and 1 <= len(e.top_logprobs) <= 2 for e in content), f"{content}")
    return f"{[(e.token, round(e.logprob, 3)) for e in content]}"


@check("errors: an unsupported parameter is a BadRequestError naming it")
def _():
    for kw, name in (
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"extra_body": {"no_such_knob": 1}}, "no_such_knob"),
    ):
        try:
            greedy(PROMPT, max_tokens=2, **kw)
        except openai.BadRequestError as e:
            expect(name in str(e), f"{name} named in {e}")
        else:
            raise AssertionError(f"{name} was accepted")
    try:
        chat(max_tokens=2, tools=[{"type": "function", "function": {"name": "f"}}])
    except openai.BadRequestError as e:
        expect("tools" in str(e), f"tools named in {e}")
    else:
        raise AssertionError("tools was accepted")
    return "presence_penalty, an unknown key and tools refused by name"


@check("errors: an unknown model is a NotFoundError")
def _():
    try:
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=1)
    except openai.NotFoundError as e:
        expect("no-such-model" in str(e), f"{e}")
    else:
        raise AssertionError("an unknown model was served")
    try:
        client.models.retrieve("no-such-model")
    except openai.NotFoundError:
        pass
    else:
        raise AssertionError("an unknown model was retrieved")
    return "completions and models.retrieve"


if failures:
    print(f"FAIL openai_client.py: {len(failures)} failed: {', '.join(failures)}")
    sys.exit(1)
