attention_bench --benchmark_filter=^Decode16K/smollm2-135m/(f16|int4|q8_0-norot)/ctx:16384/ --benchmark_min_time=1 --benchmark_out_format=json --benchmark_out=smollm2-135m.q8_0-norot.json
