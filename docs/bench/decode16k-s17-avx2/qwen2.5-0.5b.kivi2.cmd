attention_bench --benchmark_filter=^Decode16K/qwen2.5-0.5b/(f16|int4|kivi2)/ctx:16384/ --benchmark_min_time=1 --benchmark_out_format=json --benchmark_out=qwen2.5-0.5b.kivi2.json
