kvq perplexity -m .deps/models/qwen2.5-coder-0.5b-instruct.gguf -f .deps/corpus/test.txt -c 512 -b 512 -t 2 --chunks 4 --kv-cache-dtype iq4_nl --kl-divergence f16.logits
