# OptCNN's comparison with parasol's predictions.
set terminal pngcairo size 1140,380 font ',10'
set output 'layerwise.png'
set multiplot layout 1,3
set grid
set key top left
set logscale x 2
set logscale y
set xlabel 'P100 GPUs'
set ylabel 'samples/s'
set datafile missing 'NaN'
set title 'alexnet' noenhanced
plot 'layerwise.dat' index 0 using 1:2 with linespoints title 'data parallelism', '' index 0 using 1:3 with linespoints title 'model parallelism', '' index 0 using 1:4 with linespoints title 'one weird trick', '' index 0 using 1:5 with linespoints title 'layer-wise (OptCNN)'
set title 'vgg-16' noenhanced
plot 'layerwise.dat' index 1 using 1:2 with linespoints title 'data parallelism', '' index 1 using 1:3 with linespoints title 'model parallelism', '' index 1 using 1:4 with linespoints title 'one weird trick', '' index 1 using 1:5 with linespoints title 'layer-wise (OptCNN)'
set title 'inception-v3' noenhanced
plot 'layerwise.dat' index 2 using 1:2 with linespoints title 'data parallelism', '' index 2 using 1:3 with linespoints title 'model parallelism', '' index 2 using 1:4 with linespoints title 'one weird trick', '' index 2 using 1:5 with linespoints title 'layer-wise (OptCNN)'
unset multiplot
