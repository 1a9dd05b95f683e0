kvq perplexity -m .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf -f .deps/corpus/test.txt -c 512 -b 512 -t 2 --chunks 4 --kv-cache-dtype q4_1 --kl-divergence f16.logits
