set -x
cd .device/lead && gunzip -f *.gz; chmod +x *; cd ../..
R=$OUT
nvidia-smi > $R/nvidia-smi.txt 2>&1
PYTHONUNBUFFERED=1 timeout 330 python3 scripts/hf_bench.py --tilert ./.device/lead/tilert --preset deepseek-v3.2-moe --model-dir /tmp/ds-moe --contexts 1024,8192 --tokens 32 --before 1024 --json $R/hf-bench.json 2>&1 | tee $R/hf-bench.log
timeout 100 ./.device/lead/tilert bench decode --device cuda --dummy-weights glm-5 --layers 9 --context 8192,131072 --batches 1,4 --json $R/bench-glm.json 2>&1 | tee $R/bench-glm.txt
timeout 60 ./.device/lead/tilert bench decode --device cuda --dummy-weights deepseek-v3.2 --layers 9 --context 8192 --batches 1 --mtp --json $R/bench-ds-mtp.json 2>&1 | tee $R/bench-ds-mtp.txt
