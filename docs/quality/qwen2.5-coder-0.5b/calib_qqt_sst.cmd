kvq calibrate -m .deps/models/qwen2.5-coder-0.5b-instruct.gguf -f .deps/corpus/train.txt --bits 2,3,4 --tokens 2048 -c 512 --rotation qqt_sst -t 2 -o calib_qqt_sst.safetensors
