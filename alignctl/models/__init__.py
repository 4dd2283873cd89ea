"""alignctl.models: loading HF models, tiny offline models, packed forward, micro-batching.

Submodules (import them directly; this package imports nothing heavy):

- ``loading``    load_causal_lm, load_tokenizer, load_value_model / new_value_model (a one-label
                 token classifier), load_reward_model, score_last_token
- ``tiny``       init_model: tokenizer trained on local data + seeded random model, HF format
- ``attention``  block-diagonal masks and the ``alignctl_segment_sdpa`` attention implementation
- ``forward``    compute_log_probs / compute_values, padded or packed (remove padding)
- ``reward_forward`` score_shared_prompts: reward scores with a shared prompt computed once
- ``reply_likelihood`` a causal LM as a reward model: beta x a reply's summed log-probability
- ``reward_kind`` which kind of reward model a folder holds (config keys only, no torch)
- ``microbatch`` fixed and token-budgeted micro-batches, balance_batch, restore_order
- ``blocks``     transformer_blocks: the repeated blocks (FSDP2 wrap units, freeze_layers)
"""
