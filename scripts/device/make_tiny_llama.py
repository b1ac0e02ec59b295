"""Build a tiny random-weight Llama checkpoint (~3 MB) with a locally trained byte-level BPE tokenizer.
Offline: needs only torch, tokenizers and transformers.  Usage: python make_tiny_llama.py OUT_DIR

Its context is 2,048 tokens (max_position_embeddings, model_max_length): the size at which the real
sglang refused the endpoint suite's old max_tokens 2048 (sglang-deploy issue 16). scripts/device/
train_tiny_llama.py teaches it the correctness probes; scripts/device/real-sglang.sh serves both."""
import json, os, sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = sys.argv[1] if len(sys.argv) > 1 else "tiny-llama"
os.makedirs(out, exist_ok=True)

# --- tokenizer: byte-level BPE trained on a few KB of generated text -------------------------
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
words = ("the a of to and in is it you that he was for on are with as I his they be at one have this "
         "from or had by hot word but what some we can out other were all there when up use your how "
         "said an each she which do their time if will way about many then them write would like so "
         "these her long make thing see him two has look more day could go come did number sound no "
         "most people my over know water than call first who may down side been now find hello world "
         "user assistant system question answer model server token request response health generate "
         "chat completion sglang triton kernel batch cache memory attention layer").split()
corpus = []
for i in range(400):  # ~24 KB of text, deterministic
    corpus.append(" ".join(words[(i * 7 + j * 13) % len(words)] for j in range(10)) + ". " + str(i) + "\n")
corpus.append("0123456789 !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~\n")

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train_from_iterator(corpus, trainer=trainer)
tok.post_processor = processors.ByteLevel(trim_offsets=False)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
fast = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    bos_token="<|begin_of_text|>", eos_token="<|im_end|>", pad_token="<|pad|>",
    additional_special_tokens=["<|end_of_text|>", "<|im_start|>"],
    model_max_length=2048,
)
fast.chat_template = CHAT_TEMPLATE
fast.save_pretrained(out)
vocab = len(fast)

# --- model: LlamaForCausalLM, hidden 256, 2 layers, GQA 4/2 heads, random bf16 weights ---------
torch.manual_seed(0)
cfg = LlamaConfig(
    vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
    bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.generation_config.eos_token_id = fast.eos_token_id
model.generation_config.bos_token_id = fast.bos_token_id
model.generation_config.pad_token_id = fast.pad_token_id
model.save_pretrained(out, safe_serialization=True)
# Portability: name the generic fast-tokenizer class (transformers 4.x and 5.x both resolve it) and keep the
# chat template inline in tokenizer_config.json too (5.x also writes chat_template.jinja).
tc_path = os.path.join(out, "tokenizer_config.json")
tc = json.load(open(tc_path))
tc["tokenizer_class"] = "PreTrainedTokenizerFast"
tc["chat_template"] = CHAT_TEMPLATE
json.dump(tc, open(tc_path, "w"), indent=2)
cfg_path = os.path.join(out, "config.json")
c = json.load(open(cfg_path))
c.setdefault("rope_theta", 10000.0)  # 4.x-style key beside 5.x's rope_parameters
json.dump(c, open(cfg_path, "w"), indent=2)
print(json.dumps({"out": out, "vocab": vocab, "params": sum(p.numel() for p in model.parameters())}))
