kvq calibrate -m .deps/models/qwen2.5-coder-0.5b-instruct.gguf -f .deps/corpus/train.txt --bits 2 --tokens 2048 -c 512 --rotation ktk_vtv -t 2 -o calib_ktk_vtv.safetensors
