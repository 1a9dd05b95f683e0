attention_bench --benchmark_filter=^Decode16K/smollm2-135m/(f16|int4|kivi2)/ctx:16384/ --benchmark_min_time=1 --benchmark_out_format=json --benchmark_out=smollm2-135m.kivi2.json
