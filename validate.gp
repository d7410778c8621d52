# parasol validate: predicted and measured time per class of task (ms).
$data << EOD
forward 0.23561785 0.0719999994
backward 0.330045614 0.0670000004
update 0.096361589 0.318
grad-sync 0.29144506 6.96
iteration 0.119183764 3.714
EOD
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
  set terminal pngcairo size 960,600 font ',11'
} else {
  set terminal png size 960,600
}
set output 'validate.png'
set title 'mlp on dgx-a100: predicted vs measured (cpu back end)' noenhanced
set ylabel 'time (ms, device time summed per class)'
set logscale y
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set xtics rotate by -30 noenhanced
set key top left
set grid ytics
plot $data using 2:xtic(1) title 'predicted', '' using 3 title 'measured'
