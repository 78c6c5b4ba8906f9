"""OpenAI responses from a request's items: the streamed chunks (``OpenAIStreamer``) and the whole
response (``collect_openai``), with chat output parsed (reasoning, tool calls) and logprobs."""

from __future__ import annotations

from typing import Any

from tokenwire.messages.egress import Error, Frame
from tokenwire.runtime import Plan, Runtime
from tokenwire.server.http import SSE_DONE, sse
from tokenwire.server.logprobs import ChoiceLogprobs, TokenStrings
from tokenwire.server.openai.beam import beam_search
from tokenwire.server.openai.chat_output import ChoiceOutput
from tokenwire.server.openai.chunks import (
    ChunkWriter,
    delta_fields,
    finish_fields,
    openai_head,
    reasoning_count,
    usage,
)
from tokenwire.server.streaming import Gathered, Streamer, Subs, count_finish, gather, matched_stop

__all__ = ["OpenAIStreamer", "choice_logprobs", "collect_openai"]


async def collect_openai(
    rt: Runtime, plan: Plan, subs: Subs, eos: tuple[int, ...]
) -> tuple[int, Any]:
    if plan.beam is not None:  # (vLLM's beam search, in the frontend)
        got = await beam_search(rt, plan)
    else:
        got = await gather(rt, subs)
    if not isinstance(got, Gathered):
        return got
    choices = []
    reasoning_tokens = None if plan.output is None or not plan.output.reasoning else 0
    logprobs = choice_logprobs(rt, plan)
    prompt_logprobs = None
    for index, done in enumerate(got.finals):
        reason, stop_reason = finish_fields(done.finish_reason, eos)
        text = "".join(got.texts[index])
        if plan.echo is not None:
            text = plan.echo[index // plan.n] + text
        choice: dict[str, Any] = {"index": index}
        lp = None
        if logprobs is not None:
            extras = [e for x in got.extras[index] for e in (x if isinstance(x, list) else [x])]
            lp = logprobs[index].take(got.ids[index], extras)
            prompt_logprobs = logprobs[index].prompt_logprobs
        # vLLM writes these keys always, null when unused (clients read them as attributes)
        choice["token_ids"] = got.ids[index] if plan.return_token_ids else None
        if plan.route != "chat":
            choice["prompt_logprobs"] = None
            choice["prompt_token_ids"] = (
                plan.prompts[index // plan.n] if plan.return_token_ids else None
            )
        if plan.route == "chat" and plan.output is not None:
            parsed = ChoiceOutput(
                plan.output,
                rt.tokenizer,
                plan.reasoning_fields,
                parallel=plan.parallel_tool_calls,
            )
            choice["message"] = parsed.message(text, got.ids[index])
            if parsed.called and reason == "stop":
                reason = "tool_calls"
            if reasoning_tokens is not None:
                reasoning_tokens += parsed.reasoning_tokens
        elif plan.route == "chat":
            choice["message"] = {"role": "assistant", "content": text, "refusal": None}
        else:
            choice["text"] = text
        choice |= {
            "logprobs": lp,
            "finish_reason": reason,
            "stop_reason": stop_reason,
            "matched_stop": matched_stop(done.finish_reason),
        }
        if prompt_logprobs is not None and plan.route != "chat":
            choice["prompt_logprobs"] = prompt_logprobs
        choices.append(choice)
    prompt_tokens = plan.prompt_tokens
    completion_tokens = sum(done.completion_tokens for done in got.finals)
    reasoning = reasoning_count(sum(d.reasoning_tokens for d in got.finals), reasoning_tokens)
    cached = sum(done.cached_tokens for done in got.finals)
    body = openai_head(plan, chunk=False) | {
        "choices": choices,
        "usage": usage(
            prompt_tokens,
            completion_tokens,
            reasoning,
            cached_tokens=cached,
            cached_details=plan.cached_details,
        ),
    }
    if plan.route == "chat":  # vLLM writes these keys always, null when unused
        body |= {"prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None}
    body |= _chat_prompt_fields(plan)
    if prompt_logprobs is not None and plan.route == "chat":
        body["prompt_logprobs"] = prompt_logprobs  # vLLM: one prompt, at the top level
    return 200, body


def _chat_prompt_fields(plan: Plan) -> dict[str, Any]:
    """A chat response's prompt ids (vLLM's ``return_token_ids``, SGLang's
    ``return_prompt_token_ids``) and rendered prompt (vLLM's ``return_prompt_text``)."""
    out: dict[str, Any] = {}
    if plan.route == "chat":
        if plan.return_token_ids or plan.return_prompt_token_ids:
            out["prompt_token_ids"] = plan.prompts[0]
        if plan.prompt_text is not None:
            out["prompt_text"] = plan.prompt_text
    return out


def choice_logprobs(rt: Runtime, plan: Plan) -> list[ChoiceLogprobs] | None:
    """Per choice, its logprob shaper, when the request asked for logprobs."""
    p = plan.params
    if p.logprobs is None and p.prompt_logprobs is None:
        return None
    strings = TokenStrings(rt.tokenizer, as_ids=plan.return_tokens_as_token_ids)
    return [
        ChoiceLogprobs(
            strings,
            chat=plan.route == "chat",
            top=p.logprobs,
            prompt=plan.prompts[k // plan.n],
            echo=plan.echo is not None and plan.route != "chat",
            prompt_top=p.prompt_logprobs if plan.prompt_logprobs else None,
        )
        for k in range(plan.choices)
    ]


class OpenAIStreamer(Streamer):
    def __init__(self, rt: Runtime, plan: Plan, subs: Subs, eos: tuple[int, ...]) -> None:
        super().__init__(rt, subs)
        self.plan = plan
        self.writer = ChunkWriter(plan, eos)
        self.completion_tokens = 0
        self.cached_tokens = 0  # the engine's counts, summed over the choices
        self.reasoning_tokens = 0
        self.parsed: list[ChoiceOutput] | None = None
        if plan.route == "chat" and plan.output is not None:
            spec, fields = plan.output, plan.reasoning_fields
            self.parsed = [
                ChoiceOutput(
                    spec,
                    rt.tokenizer,
                    fields,
                    parallel=plan.parallel_tool_calls,
                    hold_reasoning=not plan.stream_reasoning,
                )
                for _ in subs
            ]
        self.logprobs = choice_logprobs(rt, plan)
        # Choices whose first chunk is still to come (it carries the echoed prompt, the
        # prompt's ids).
        firsts = plan.echo or self.logprobs or plan.return_token_ids
        self.fresh = set(range(len(subs))) if firsts else set()
        # Steps' plain chunks formatted from their text alone (``feed_steps``): without
        # logprobs, an echo, token ids, or thinking held back until it ends.
        self._steps = (
            len(subs) == 1
            and not firsts
            and (self.parsed is None or not self.parsed[0].hold_reasoning)
        )
        self._reasoning_keys = tuple(plan.reasoning_fields)

    @property
    def takes_steps(self) -> bool:
        return self._steps and "feed" not in vars(self)

    def feed_steps(self, steps: list[tuple[str, int, int]]) -> bytes:
        """``feed`` for steps' plain chunks of the one choice (``(text, token id, completion
        tokens)`` each), the same bytes: without a parser the texts go out as one delta; with
        one, each piece its own, through the parser's fast path where it applies."""
        self.tracker.chunk()
        writer = self.writer
        parsed = self.parsed
        if parsed is None:
            texts = []
            count = 0
            for text, _, tokens in steps:
                if text:
                    texts.append(text)
                    count = tokens
            return writer.delta(0, "".join(texts), count) if texts else b""
        choice = parsed[0]
        parser = choice.parser
        reasoning = self._reasoning_keys
        out = []
        for text, token_id, tokens in steps:
            kind = parser.feed_plain(text, 1)
            if kind == 2:
                if text:
                    out.append(writer.text_delta(0, ("content",), text, tokens))
            elif kind == 1:
                if text and reasoning:
                    out.append(writer.text_delta(0, reasoning, text, tokens))
            else:
                delta = choice.delta(text, [token_id])
                if delta:
                    out.append(writer.chunk(0, delta_fields(delta), tokens))
        return b"".join(out)

    def _extras(self, index: int, item: Any) -> tuple[str, dict[str, Any]]:
        """The echoed prompt (first chunk only) and the logprob fields of an item's chunk."""
        first = index in self.fresh
        self.fresh.discard(index)
        plan = self.plan
        prefix = plan.echo[index // plan.n] if first and plan.echo is not None else ""
        fields: dict[str, Any] = {}
        if self.logprobs is not None:
            shaper = self.logprobs[index]
            fields["logprobs"] = shaper.take(item.token_ids, item.extras)
            if first and shaper.prompt_logprobs is not None:
                fields["prompt_logprobs"] = shaper.prompt_logprobs
        if plan.return_token_ids:  # vLLM's: this chunk's ids; the prompt's in the first
            fields["token_ids"] = list(item.token_ids)
            if first and plan.route != "chat":
                fields["prompt_token_ids"] = plan.prompts[index // plan.n]
        return prefix, fields

    def head(self) -> bytes:
        if self.plan.route == "chat":
            top = _chat_prompt_fields(self.plan)
            if top:  # the first chunk carries the prompt's ids and text (vLLM's)
                delta = {"role": "assistant", "content": ""}
                first = openai_head(self.plan, chunk=True) | {
                    "choices": [{"index": 0} | delta_fields(delta)],
                    **top,
                }
                rest = b"".join(self.writer.role(k) for k in range(1, len(self.subs)))
                return sse(first) + rest
            return b"".join(self.writer.role(k) for k in range(len(self.subs)))
        return b""

    def feed(self, batch: list[tuple[int, Any]]) -> bytes:
        """SSE bytes for a batch of items. A choice's plain text deltas that wait together go
        out as one chunk (as vLLM merges the outputs a stream has not taken yet); with logprobs,
        an echo or an output parser, every item keeps its own."""
        self.tracker.chunk()
        writer = self.writer
        out: list[bytes] = []
        parsed = self.parsed
        run: list[str] = []  # texts of plain deltas of choice ``run_index`` not written yet
        run_index = run_tokens = 0
        for index, item in batch:
            # (Only plain deltas start a run: with logprobs, an echo still to come or a parser,
            # none does; a final item of the same choice takes the run's text.)
            if run and (index != run_index or isinstance(item, Error)):
                out.append(writer.delta(run_index, "".join(run), run_tokens))
                run = []
            if isinstance(item, Frame):
                if self.fresh or self.logprobs is not None or self.plan.return_token_ids:
                    out.append(self._chunk(index, item))
                elif parsed is not None:
                    delta = parsed[index].delta(item.text, item.token_ids)
                    if delta:
                        out.append(writer.chunk(index, delta_fields(delta), item.completion_tokens))
                elif item.text:
                    run.append(item.text)
                    run_index = index
                    run_tokens = item.completion_tokens
                continue
            if isinstance(item, Error):
                out.append(self.error(item.error))
                break
            self.open.discard(index)
            count_finish(self.rt, item, self.tracker)
            self.completion_tokens += item.completion_tokens
            self.cached_tokens += item.cached_tokens
            self.reasoning_tokens += item.reasoning_tokens
            prefix, fields = self._extras(index, item)
            text = prefix + item.text
            if run:  # this choice's waiting deltas end with it
                text = "".join(run) + text
                run = []
            if parsed is not None:
                choice = parsed[index]
                delta = choice.final(prefix + item.text, item.token_ids)
                reason = "tool_calls" if choice.called else None
                if reason and item.finish_reason and item.finish_reason.kind != "stop":
                    reason = None  # length, abort: said as they are
                out.append(
                    writer.final(
                        index,
                        text,
                        item.finish_reason,
                        item.completion_tokens,
                        delta=delta,
                        reason=reason,
                        extra=fields,
                    )
                )
            else:
                out.append(
                    writer.final(
                        index, text, item.finish_reason, item.completion_tokens, extra=fields
                    )
                )
            if not self.open:
                plan = self.plan
                if plan.include_usage:
                    reasoning = None
                    if parsed is not None and plan.output and plan.output.reasoning:
                        reasoning = sum(c.reasoning_tokens for c in parsed)
                    reasoning = reasoning_count(self.reasoning_tokens, reasoning)
                    out.append(
                        writer.usage(
                            plan.prompt_tokens,
                            self.completion_tokens,
                            reasoning,
                            cached_tokens=self.cached_tokens,
                        )
                    )
                out.append(SSE_DONE)
        if run:
            out.append(writer.delta(run_index, "".join(run), run_tokens))
        return b"".join(out)

    def _chunk(self, index: int, item: Any) -> bytes:
        """An intermediate chunk with the echoed prompt or logprobs (an empty delta when a
        parser holds the text back: the logprobs still go out)."""
        prefix, fields = self._extras(index, item)
        text = prefix + item.text
        parsed = self.parsed
        if self.plan.route != "chat":
            payload: dict[str, Any] = {"text": text}
        elif parsed is not None:  # (an echoed prefix is parsed as the whole response parses it)
            payload = {"delta": parsed[index].delta(text, item.token_ids)}
        else:
            payload = {"delta": {"content": text} if text else {}}
        payload |= {"logprobs": None, "finish_reason": None} | fields
        return self.writer.chunk(index, payload, item.completion_tokens)
