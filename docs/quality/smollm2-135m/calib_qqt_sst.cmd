kvq calibrate -m .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf -f .deps/corpus/train.txt --bits 2,3,4 --tokens 2048 -c 512 --rotation qqt_sst -t 2 -o calib_qqt_sst.safetensors
