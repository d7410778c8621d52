# parasol compare: best predicted iteration time against search time.
$a0 << EOD
0.004620 446.649429
2.891049 446.649429

EOD
$a1 << EOD
0.001992 446.649429
0.079518 444.43556
0.152685 441.091266
1.726134 438.630663
2.113211 438.322473
2.136937 438.123779
2.907228 438.123779

EOD
$a2 << EOD
0.001682 446.649429
0.206549 444.43556
0.358573 441.091266
2.533056 438.630663
2.920860 438.630663

EOD
$a3 << EOD
0.004243 446.649429
0.851318 434.121765
2.879310 434.121765

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
