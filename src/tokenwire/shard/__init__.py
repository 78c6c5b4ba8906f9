"""The shard: per-request egress state for every request in flight, stepped by the engine's
decode steps.

For every decode step the engine sends one batch frame. The shard detokenizes every request's new
tokens together (``DecodeBatch``), then, per request and per token in order:

1. A token-level stop (EOS, ``stop_token_ids``: the engine's ``stop`` finish with a token
   ``matched``) is not emitted as text unless ``no_stop_trim``; it still counts as a token. A stop
   token *sequence* (a list in ``stop_token_ids``) is matched here too, for engines that do not
   match sequences: the text of the tokens that may begin one is held back, and a matched
   sequence's whole text is dropped unless ``no_stop_trim`` (its ids still count and are sent).
2. Its text comes from the request's decode stream; an id the tokenizer cannot map ends only this
   request (``Error`` item, engine abort).
3. Past ``min_new_tokens``, stop strings: the earliest-completing match that includes new text wins
   (ties in list order); the text ends at the match start (through the stop with
   ``no_stop_trim``); later tokens of the step are dropped; the engine request is aborted.
4. Stop regexes (RE2), over the window their ``max_len`` needs: a match stops the same way, with
   the matched text kept and ``matched`` the pattern.
5. While streaming, the longest suffix that is a prefix of some stop string is held back, so no
   partial stop string ever reaches the client.
6. The engine's own finish (``length``, EOS, abort) passes through on a final ``Done`` with the
   held text and whatever the decoder still holds.
7. With ``stream_interval`` N > 1, a request's text and ids go out when its token count reaches
   1, N + 1, 2N + 1... (SGLang's points; a step of several tokens goes out if it reaches one)
   and when it ends; in between they wait in the request's state.

Modules, one concept each: ``shard`` (``DetokShard``: the columns, registering and ending
requests), ``request`` (one request's state), ``fast_step`` (the columnar one-token step, with
step-wide stop checks and hold-back), ``general_step`` (request by request), ``stop_sequences``,
``holdback`` (the stop strings' hold-back automaton) and ``delivery`` (sinks, merging,
stalls).
"""

from tokenwire.shard.delivery import DEFAULT_MAX_PENDING, DEFAULT_MAX_STALL
from tokenwire.shard.shard import DetokShard

__all__ = ["DEFAULT_MAX_PENDING", "DEFAULT_MAX_STALL", "DetokShard"]
