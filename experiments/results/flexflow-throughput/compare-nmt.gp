# parasol compare: best predicted iteration time against search time.
$a0 << EOD
0.012735 446.649429
2.869358 446.649429

EOD
$a1 << EOD
0.002674 446.649429
0.169916 444.43556
0.268313 441.091266
1.726872 438.630663
2.162011 438.322473
2.180062 438.123779
2.778740 437.819897
2.795680 437.615347
2.904399 437.615347

EOD
$a2 << EOD
0.001865 446.649429
0.114478 444.43556
0.224775 441.091266
1.236415 438.630663
1.562008 438.322473
1.564850 438.123779
1.974094 437.819897
1.976763 437.615347
2.440038 437.311644
2.454013 437.110123
2.918072 437.110123

EOD
$a3 << EOD
0.003613 446.649429
0.356606 434.121765
2.864441 434.121765

EOD
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
  set terminal pngcairo size 960,600 font ',11'
} else {
  set terminal png size 960,600
}
set output 'compare-nmt.png'
set title 'nmt on flexflow-p100' noenhanced
set xlabel 'search time (s)'
set ylabel 'best predicted iteration time (ms)'
set key outside right top noenhanced
set grid
plot $a0 using 1:2 with steps linewidth 2 linecolor 1 title 'mcmc', \
     $a1 using 1:2 with steps linewidth 2 linecolor 2 title 'optcnn', \
     $a2 using 1:2 with steps linewidth 2 linecolor 3 title 'dp', \
     $a3 using 1:2 with steps linewidth 2 linecolor 4 title 'beam', \
     446.649429 with lines dashtype 2 linecolor 'gray' title 'data parallel'
