# Training throughput against GPUs (parasol's predictions).
set terminal pngcairo size 1800,560 font ',9'
set output 'throughput.png'
set multiplot layout 2,6
set logscale x 2
set logscale y
set grid
set key top left
set xlabel 'GPUs'
set ylabel 'samples/s'
set datafile missing 'NaN'
set title 'alexnet, P100 cluster' noenhanced
plot 'throughput.dat' index 0 using 1:2 with linespoints title 'data parallel', '' index 0 using 1:3 with linespoints title 'expert', '' index 0 using 1:4 with linespoints title 'FlexFlow (MCMC)'
set title 'inception-v3, P100 cluster' noenhanced
plot 'throughput.dat' index 1 using 1:2 with linespoints title 'data parallel', '' index 1 using 1:3 with linespoints title 'expert', '' index 1 using 1:4 with linespoints title 'FlexFlow (MCMC)'
set title 'resnet-101, P100 cluster' noenhanced
plot 'throughput.dat' index 2 using 1:2 with linespoints title 'data parallel', '' index 2 using 1:3 with linespoints title 'expert', '' index 2 using 1:4 with linespoints title 'FlexFlow (MCMC)'
set title 'rnntc, P100 cluster' noenhanced
plot 'throughput.dat' index 3 using 1:2 with linespoints title 'data parallel', '' index 3 using 1:3 with linespoints title 'expert', '' index 3 using 1:4 with linespoints title 'FlexFlow (MCMC)'
set title 'rnnlm, P100 cluster' noenhanced
plot 'throughput.dat' index 4 using 1:2 with linespoints title 'data parallel', '' index 4 using 1:3 with linespoints title 'expert', '' index 4 using 1:4 with linespoints title 'FlexFlow (MCMC)'
set title 'nmt, P100 cluster' noenhanced
plot 'throughput.dat' index 5 using 1:2 with linespoints title 'data parallel', '' index 5 using 1:3 with linespoints title 'expert', '' index 5 using 1:4 with linespoints title 'FlexFlow (MCMC)'
set title 'alexnet, K80 cluster' noenhanced
plot 'throughput.dat' index 6 using 1:2 with linespoints title 'data parallel', '' index 6 using 1:3 with linespoints title 'expert', '' index 6 using 1:4 with linespoints title 'FlexFlow (MCMC)'
set title 'inception-v3, K80 cluster' noenhanced
plot 'throughput.dat' index 7 using 1:2 with linespoints title 'data parallel', '' index 7 using 1:3 with linespoints title 'expert', '' index 7 using 1:4 with linespoints title 'FlexFlow (MCMC)'
set title 'resnet-101, K80 cluster' noenhanced
plot 'throughput.dat' index 8 using 1:2 with linespoints title 'data parallel', '' index 8 using 1:3 with linespoints title 'expert', '' index 8 using 1:4 with linespoints title 'FlexFlow (MCMC)'
set title 'rnntc, K80 cluster' noenhanced
plot 'throughput.dat' index 9 using 1:2 with linespoints title 'data parallel', '' index 9 using 1:3 with linespoints title 'expert', '' index 9 using 1:4 with linespoints title 'FlexFlow (MCMC)'
set title 'rnnlm, K80 cluster' noenhanced
plot 'throughput.dat' index 10 using 1:2 with linespoints title 'data parallel', '' index 10 using 1:3 with linespoints title 'expert', '' index 10 using 1:4 with linespoints title 'FlexFlow (MCMC)'
set title 'nmt, K80 cluster' noenhanced
plot 'throughput.dat' index 11 using 1:2 with linespoints title 'data parallel', '' index 11 using 1:3 with linespoints title 'expert', '' index 11 using 1:4 with linespoints title 'FlexFlow (MCMC)'
unset multiplot
