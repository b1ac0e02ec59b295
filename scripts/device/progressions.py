"""The language of the tiny trained DeepSeek-V3 (train_tiny_mtp.py), shared with the quality check's prompt set
for it (quality_prompts_tiny.py): ``tokN`` words whose ids step by a stride from STRIDES, modulo the vocabulary
past its special tokens, the stride changing now and then. No torch here: the prompt set is written anywhere."""

from __future__ import annotations

# The model's vocabulary (make_glm5_arch.write_tokenizer: 3 special tokens, then tok3 .. tok<VOCAB-1>).
VOCAB = 1024
SPECIALS = 3  # the tokenizer's <|begin_of_text|>, <|end_of_text|>, <|unk|>: never in the data
STRIDES = (1, 2, 3, 5, 7)
# At each step a progression takes a new stride (one of STRIDES, drawn afresh) with this probability. The
# model's next-token distribution then has real spread (about 0.9 on the stride the last two tokens show,
# the rest over the others) instead of one certain token: a launch that computes the model slightly
# differently moves that distribution (what `sglang-deploy quality check` measures), and greedy decoding
# still continues the stride, which the trained draft predicts.
SWITCH_PROBABILITY = 0.1
