kvq perplexity -m .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf -f .deps/corpus/test.txt -c 512 -b 512 --chunks 4 -t 2 --kv-cache-dtype turboquant_k3v4_nc  --kl-divergence f16.logits
