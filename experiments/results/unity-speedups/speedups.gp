# Unity's comparison with parasol's predictions.
set terminal pngcairo size 1100,450 font ',10'
set output 'speedups.png'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set grid ytics
set logscale y 2
set datafile missing 'NaN'
set key top left
set xtics rotate by -30
set title 'speedup over data parallelism, 48 V100 (summit:8)'
set ylabel 'speedup over data parallel'
plot 'speedups.dat' index 0 using 2:xtic(1) title 'joint', '' index 0 using 3 title 'parallelization alone', '' index 0 using 4 title 'substitutions, then parallelization'
set output 'search-time.png'
set style data linespoints
unset logscale y
set logscale x 2
set xtics norotate
set xlabel 'GPUs'
set ylabel 'seconds to 95% of the result'
set title 'joint search time against GPUs'
plot 'speedups.dat' index 1 using 1:2 title 'inception-v3', 'speedups.dat' index 1 using 1:3 title 'resnext-50', 'speedups.dat' index 1 using 1:4 title 'bert-large', 'speedups.dat' index 1 using 1:5 title 'dlrm', 'speedups.dat' index 1 using 1:6 title 'candle-uno', 'speedups.dat' index 1 using 1:7 title 'xdl', 'speedups.dat' index 1 using 1:8 title 'mlp'
