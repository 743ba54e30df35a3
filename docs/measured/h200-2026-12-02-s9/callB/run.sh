set -x
gunzip -c .device/hold/decode.test.gz > .device/next/decode.test; chmod +x .device/next/decode.test; ls -la .device/next
sed -e 's/^cd .device\/next && gunzip.*$/true/' docs/measured/next/run.sh > /tmp/runB.sh
bash /tmp/runB.sh
tail -40 /tmp/next/gpu-check.txt
