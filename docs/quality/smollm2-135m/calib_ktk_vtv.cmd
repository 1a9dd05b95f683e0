kvq calibrate -m .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf -f .deps/corpus/train.txt --bits 2 --tokens 2048 -c 512 --rotation ktk_vtv -t 2 -o calib_ktk_vtv.safetensors
