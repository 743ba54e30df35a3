# Session 14 call E (tilert of main bde999a): the in-graph profile at 8192 and 131072, 1 slot, both models, with
# today's defaults, for the closing note's "where the time goes".
set -x
cd .device/next && xz -d -f tilert.xz; chmod +x tilert; cd ../..
D=$PWD/.device/next
R=/tmp/s14e; rm -rf $R; mkdir -p $R
export TILERT_KERNEL_CACHE=/tmp/tilert-kernels
for m in deepseek-v3.2 glm-5; do for c in 8192 131072; do
  timeout 110 $D/tilert bench decode --device cuda --dummy-weights $m --layers 9 --context $c --batches 1 --profile > $R/profile-$m-$c.txt 2>&1
  tar czf $OUT/e.tgz -C $R .
done; done
