NAME=s52
. docs/measured/next/plan.sh rt
tst kernels cuda/kernels 100 '^TestKernelSmallFast$'; cnt kernels; grep -E "moe_route_sort" $R/kernels.log | head -30 >> $R/summary.txt; save
abab deepseek-v3.2 8192 1 rs8 TILERT_GPU_ROUTE_SORT=1
abab glm-5 8192 1 rg8 TILERT_GPU_ROUTE_SORT=1
save
