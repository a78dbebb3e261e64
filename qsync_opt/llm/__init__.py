"""The LLM cost model, shared by the kinds that price a decoder-only transformer (serving, rollout).

    config   TransformerConfig (a preset and/or shape fields), PRESETS, BitWidth
    costs    phase-aware roofline costs of one decoder layer per device and bit-width
             (prefill, decode, LM head, stage transfers) and its memory (weights, KV cache,
             activations, capacity)

It knows devices (`qsync_opt.hardware`) and no kind.
"""
