"""One chat completion on an engine: segment, tokenize, generate (optionally streaming text),
parse tool calls, report reuse, remember the turn for the conversation."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentcache.backends import ServingEngine
from agentcache.chat.diagnostics import ReuseReport, build_report
from agentcache.chat.logprobs import LogprobRecorder, TokenLogprob
from agentcache.chat.messages import ChatMessage, ToolCall, ToolSpec
from agentcache.chat.retention import RetentionReport, TurnRetention
from agentcache.chat.segmenter import ChatPrompt, ConversationTracker
from agentcache.chat.stream import TextStream
from agentcache.chat.structured import GrammarConstraint, Grammars, OutputFormat, SchemaError
from agentcache.chat.tools import TOOL_CALL_OPEN, InvalidToolCall, ParsedReply, parse_tool_calls
from agentcache.errors import AgentCacheError, ContextLengthError, PromptError
from agentcache.prompt.segments import Segment
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.runtime.engine import Generation, GenerationParams
from agentcache.runtime.params import TokenConstraint


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[ChatMessage, ...]
    params: GenerationParams = field(default_factory=GenerationParams)
    tools: tuple[ToolSpec, ...] = ()
    conversation: str | None = None  # the token a previous result gave (report.conversation_id)
    prefill: str | None = None  # text the reply starts with; the model continues it
    strategy: str | None = None
    tenant: str = ""  # identity.tenant_id of the caller: its requests share no KV with others'
    cache_key: str | None = None  # prompt_cache_key: groups reports, never scopes reuse
    output: OutputFormat | None = None  # structured outputs: the reply held to a grammar
    logprobs: int | None = None  # record each token's logprob and this many top ones
    # keep what the turn stores this many seconds (a cache control, granted up to the
    # server's cap); None: only a turn ending in a tool call is kept, for the learned time
    retention_s: float | None = None
    # the reply may be a tool call: its call blocks are held back while streaming and parsed
    # into calls. False (tool_choice none): the tools stay in the prompt, but whatever the
    # model writes is the reply's text, a call's markup included
    tool_calls: bool = True


@dataclass(frozen=True)
class PreparedChat:
    request: ChatRequest
    chat: ChatPrompt
    tokens: TokenizedPrompt


@dataclass(frozen=True)
class ChatResult:
    text: str  # the whole reply, prefill included
    content: str  # the reply without tool-call blocks
    tool_calls: tuple[ToolCall, ...]
    invalid_tool_calls: tuple[InvalidToolCall, ...]
    finish_reason: str  # stop | length | tool_calls
    generation: Generation
    report: ReuseReport
    # streamed pieces that the final content did not extend (decoding a prefix of the ids
    # gave other text); the stream then ends without the rest. Counted by the server.
    stream_mismatch: bool = False
    stop_sequence: str | None = None  # the stop string that ended the reply, if one did
    # tokens that reached a constrained reply without its mask and broke its grammar (a
    # decoder that chose them); 0 when the reply was constrained throughout
    format_violations: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None  # when the request asked for them
    retention: RetentionReport | None = None  # with a ChatEngine that retains

    @property
    def prompt_tokens(self) -> int:
        return self.generation.stats.prompt_tokens

    @property
    def fallbacks(self) -> int:
        """The engine's fallbacks (`report.fallbacks` too)."""
        return self.generation.stats.fallbacks

    @property
    def completion_tokens(self) -> int:
        return len(self.generation.token_ids)

    def message(self) -> ChatMessage:
        return ChatMessage("assistant", self.content, self.tool_calls)


def _stopped_by(
    gen: Generation, req: ChatRequest, decode: Callable[[Sequence[int]], str]
) -> str | None:
    """The stop string the generated text ran into first (the engine cuts the text there)."""
    if gen.finish_reason != "stop" or not req.params.stop:
        return None
    whole = decode(gen.token_ids)
    found = [(i, s) for s in req.params.stop if (i := whole.find(s)) >= 0]
    return min(found)[1] if found else None


def tool_chars(tools: Sequence[ToolSpec]) -> int:
    """Characters of tool names, descriptions and parameter schemas (as JSON)."""
    return sum(
        len(t.name) + len(t.description) + len(json.dumps(t.parameters, ensure_ascii=False))
        for t in tools
    )


def prompt_chars(request: ChatRequest) -> int:
    """Characters the prompt of `request` is made of: message contents, tool calls, tools and
    the prefill (the chat template's markup aside). What tokenizing it costs."""
    total = tool_chars(request.tools) + len(request.prefill or "")
    for m in request.messages:
        total += len(m.content) + sum(len(c.name) + len(c.arguments_json()) for c in m.tool_calls)
    return total


# A token's text in the tokenizer's vocabulary can be shorter than the input text it stands for
# only through the tokenizer's normalizer (e.g. NFC joining a letter and its accent); this
# bounds that, so the lower bound on a prompt's tokens below stays a lower bound.
NORMALIZED_SLACK = 2


class TextTooLongError(ContextLengthError):
    """A prompt whose text alone is more tokens than the context holds, found before it is
    tokenized (from its characters and the tokenizer's longest token)."""

    def __init__(self, chars: int, at_least: int, max_context: int, longest: int) -> None:
        PromptError.__init__(
            self,
            f"the prompt's text is {chars} characters, at least {at_least} tokens (the "
            f"tokenizer's longest token is {longest} characters), but the model's context "
            f"holds {max_context} positions; refused before tokenizing",
        )
        self.num_tokens, self.max_tokens = at_least, max_context


class GenerationCancelled(AgentCacheError):
    """The caller cancelled the generation (its client went away, or its deadline passed)."""


# temperatures this small would overflow the logits' scaling; they decode greedily
GREEDY_BELOW = 1e-5


class ChatEngine:
    """Chat front of a `ServingEngine` (the embedded `Engine` or the vLLM backend).
    Thread-safe: the engine interleaves (embedded) or serializes (vLLM) generations, the
    tracker locks its own state."""

    def __init__(
        self, engine: ServingEngine, tracker: ConversationTracker | None = None,
        retention: TurnRetention | None = None,
    ) -> None:  # fmt: skip
        """`retention`: keep turns that end in a tool call or ask for it (chat/retention.py)."""
        self.engine = engine
        self.tracker = tracker or ConversationTracker()
        self.retention = retention
        self._grammars: Grammars | None = None
        self._longest: int | None = None  # the tokenizer's longest token, in characters

    @property
    def max_context(self) -> int:
        return self.engine.max_context

    def check_text_size(self, request: ChatRequest) -> None:
        """TextTooLongError when the prompt's characters alone prove it cannot fit the
        context: at least chars / (longest token x NORMALIZED_SLACK) tokens. Costs one pass
        over the text, not a tokenization."""
        longest = self._longest_token()
        if longest <= 0:
            return
        chars = prompt_chars(request)
        at_least = chars // (longest * NORMALIZED_SLACK)
        if at_least > self.max_context:
            raise TextTooLongError(chars, at_least, self.max_context, longest)

    def _longest_token(self) -> int:
        """Characters of the tokenizer's longest vocabulary entry (0: unknown). A vocabulary
        entry has at least as many characters as the text it decodes to (byte-level and
        sentencepiece entries spell each byte or space with one character or more)."""
        if self._longest is None:
            vocab = getattr(self.engine.tokenizer, "vocab", None)
            self._longest = max(map(len, vocab), default=0) if isinstance(vocab, dict) else 0
        return self._longest

    def prepare(self, request: ChatRequest, clamp_max_tokens: bool = False) -> PreparedChat:
        """Segment and tokenize; raises PromptError / ContextLengthError on bad input.
        `clamp_max_tokens` lowers max_new_tokens to the context left instead of raising."""
        self.check_text_size(request)
        r = request
        chat = self.tracker.segment(
            r.messages, r.tools, r.conversation, r.prefill, r.tenant, r.cache_key
        )
        if 0.0 < request.params.temperature < GREEDY_BELOW:
            request = replace(request, params=replace(request.params, temperature=0.0))
        constraint: TokenConstraint | None = None
        if r.output is not None:
            constraint = self._constraint(r.output)
        if r.logprobs is not None:
            self._check_own_loop("logprobs")
            constraint = LogprobRecorder(r.logprobs, constraint)
        if constraint is not None:
            request = replace(request, params=replace(request.params, constraint=constraint))
        tokens = self.engine.tokenize(chat.prompt)
        left = self.max_context - tokens.num_tokens
        if clamp_max_tokens and 0 < left < request.params.max_new_tokens:
            params = replace(request.params, max_new_tokens=left)
            request = replace(request, params=params)
        needed = tokens.num_tokens + request.params.max_new_tokens
        if needed > self.max_context:
            raise ContextLengthError(
                needed, self.max_context, "prompt + max_tokens", self.engine.context_holder
            )
        return PreparedChat(request, chat, tokens)

    def count_tokens(self, request: ChatRequest) -> int:
        """The prompt tokens `request` would be prefilled with (chat template, tools block and
        prefill included), counted by the engine's own tokenizer; nothing is generated,
        looked up or remembered. A structured-output format is checked as `prepare` checks
        it."""
        self.check_text_size(request)
        r = request
        if r.output is not None:
            self._constraint(r.output)
        chat = self.tracker.segment(r.messages, r.tools, None, r.prefill, r.tenant)
        return self.engine.tokenize(chat.prompt).num_tokens

    def _constraint(self, fmt: OutputFormat) -> GrammarConstraint:
        """A fresh grammar constraint for one reply. The embedded engine's decode loop applies
        it; an engine without one (vLLM), or greedy verified decoding (which chooses tokens
        without the sampler), cannot, and is refused rather than ignored."""
        model = self._check_own_loop("structured outputs", fmt.param)
        if self._grammars is None:
            self._grammars = Grammars(self.engine.tokenizer, model.config.vocab_size)
        return self._grammars.constraint(fmt)

    def _check_own_loop(self, what: str, param: str | None = None) -> Any:
        """The embedded engine's model, when its decode loop samples every token (where a
        constraint sees each step); else SchemaError naming `param`."""
        model = getattr(self.engine, "model", None)
        setup = getattr(self.engine, "decode", None)
        if model is None or setup is None:
            raise SchemaError(f"{what} need the embedded engine", param)
        if setup.config.verify > 0:
            raise SchemaError(f"{what} cannot be served under verified decoding (decode option "
                              "verify), which chooses tokens without sampling", param)  # fmt: skip
        return model

    def run(
        self,
        prepared: PreparedChat,
        on_text: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> ChatResult:
        """Generate. `on_text` receives the reply's content as it is produced, in pieces whose
        concatenation is the final `content` (tool-call blocks and stop strings held back).
        Once `cancel` is set, generation stops at the next token with `GenerationCancelled`
        and the turn is not recorded; the engine gets it too, and stops a prefill where it
        can with `TurnCancelled` (`ServingEngine.generate`)."""
        req = prepared.request
        kept = self.retention
        resumed = kept.begin(prepared.chat, req.tenant) if kept is not None else None
        tok = self.engine.tokenizer
        calls = bool(req.tools) and req.tool_calls
        holds = (TOOL_CALL_OPEN,) if calls else ()
        stream = TextStream(tok.decode, req.params.stop, holds, req.prefill or "")
        if on_text is not None:
            on_text(stream.start())

        def on_token(token: int) -> None:
            if cancel is not None and cancel.is_set():
                raise GenerationCancelled("generation cancelled")
            if on_text is not None and (piece := stream.push(token)):
                on_text(piece)

        def parse(generated: str) -> ParsedReply:
            text = (req.prefill or "") + generated
            return parse_tool_calls(text) if calls else ParsedReply(text, (), ())

        def reply(generated: str) -> Segment:
            p = parse(generated)
            message = ChatMessage("assistant", p.content, p.tool_calls)
            return self.tracker.reply_segment(prepared.chat, message)

        watched = on_text is not None or cancel is not None
        gen = self.engine.generate(
            prepared.tokens, req.params, req.strategy, on_token=on_token if watched else None,
            reply=reply, cancel=cancel,
        )  # fmt: skip
        text = (req.prefill or "") + gen.text
        parsed = parse(gen.text)
        content = parsed.content
        if on_text is not None:
            rest = stream.finish(content)
            if rest:
                on_text(rest)
        finish = "tool_calls" if parsed.tool_calls else gen.finish_reason
        report = build_report(prepared.chat, prepared.tokens, gen.stats)
        recorder = req.params.constraint
        recorder = recorder if isinstance(recorder, LogprobRecorder) else None
        result = ChatResult(
            text, content, parsed.tool_calls, parsed.invalid_tool_calls, finish, gen, report,
            stream_mismatch=stream.mismatches > 0, stop_sequence=_stopped_by(gen, req, tok.decode),
            format_violations=getattr(req.params.constraint, "violations", 0),
            logprobs=recorder.finish(gen.token_ids) if recorder is not None else None,
        )  # fmt: skip
        message = result.message()
        if kept is not None:
            segment = self.tracker.reply_segment(prepared.chat, message)
            kept_for = kept.end(prepared.chat, prepared.tokens, req.tenant, message, segment,
                                req.retention_s, resumed)  # fmt: skip
            result = replace(result, retention=kept_for)
        self.tracker.record(prepared.chat, message)
        return result

    def complete(
        self,
        messages: Sequence[ChatMessage],
        params: GenerationParams | None = None,
        tools: Sequence[ToolSpec] = (),
        conversation: str | None = None,
        prefill: str | None = None,
        strategy: str | None = None,
    ) -> ChatResult:
        request = ChatRequest(
            tuple(messages), params or GenerationParams(), tuple(tools), conversation, prefill,
            strategy,
        )  # fmt: skip
        return self.run(self.prepare(request))
