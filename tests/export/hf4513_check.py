"""Run inside the transformers 4.51.3 venv: load each export folder given as an argument the way
Bedrock's runtime would and print what it got as JSON (config, tokenizer ids, chat template, logits)."""
import inspect
import json
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

assert transformers.__version__ == "4.51.3", transformers.__version__
prompts = json.loads(sys.argv[1])
out = {}
for folder in sys.argv[2:]:
    config = AutoConfig.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    ids = [tok(p).input_ids for p in prompts]
    with torch.no_grad():
        logits = [model(input_ids=torch.tensor([i])).logits[0].tolist() for i in ids]
    chat = tok.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True)
    params = set(inspect.signature(type(config).__init__).parameters) - {"self", "kwargs"}
    out[folder] = {"config_class": type(config).__name__, "model_class": type(model).__name__,
                   "tokenizer_class": type(tok).__name__, "rope_theta": getattr(config, "rope_theta", None),
                   "rope_scaling": getattr(config, "rope_scaling", None), "torch_dtype": str(config.torch_dtype),
                   "ids": ids, "logits": logits, "chat": chat, "init_params": sorted(params)}
print(json.dumps(out))
